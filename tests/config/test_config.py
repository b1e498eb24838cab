import pytest

from router.config.model import ConfigError, load_config


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_defaults_and_file(tmp_path):
    cfg = load_config(write(tmp_path, "instances:\n  - url: http://127.0.0.1:8001/\n    role: decode\n"))
    assert cfg.instances[0].url == "http://127.0.0.1:8001" and cfg.instances[0].role == "decode"
    assert cfg.state.backend == "memory" and cfg.policy.name == "ttft"
    assert cfg.hashing.block_tokens == 64


def test_environment_overrides_nested_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("PD_ROUTER_STATE__BACKEND", "redis")
    monkeypatch.setenv("PD_ROUTER_POLICY__TTFT__PREFILL_TOKENS_PER_S", "1234.5")
    cfg = load_config(write(tmp_path, "state:\n  backend: memory\n  key_prefix: mine\n"))
    assert cfg.state.backend == "redis" and cfg.state.key_prefix == "mine"
    assert cfg.policy.ttft.prefill_tokens_per_s == 1234.5


@pytest.mark.parametrize(
    "text, field",
    [
        ("instances:\n  - url: ftp://x\n", "instances.0.url"),
        ("instances:\n  - url: http://a:1\n    role: both\n", "instances.0.role"),
        ("policy:\n  name: fast est\n", "policy.name"),  # unknown presets: tests/scheduling/test_registry.py
        ("state:\n  lease_s: 90\n", "state.lease_s"),
        ("typo_section: {}\n", "typo_section"),
        ("instances:\n  - url: http://a:1\n  - url: http://a:1\n", "duplicate instance"),
        ("- just\n- a list\n", "mapping at the top level"),
        ("instances: [\n", "not valid YAML"),
    ],
)
def test_invalid_config_names_the_field(tmp_path, text, field):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert field in str(info.value)


def test_kv_bytes_per_token_derived_from_model_shape(tmp_path):
    text = "instances:\n  - url: http://a:1\n    kv_shape: {layers: 80, kv_heads: 8, head_dim: 128}\n"
    assert load_config(write(tmp_path, text)).instances[0].kv_bytes_per_token == 327680  # Llama-3-70B bf16
    bad = text.replace("}", "}\n    kv_bytes_per_token: 1000")
    with pytest.raises(ConfigError, match="contradicts kv_shape"):
        load_config(write(tmp_path, bad))
