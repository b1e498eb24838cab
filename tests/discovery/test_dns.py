"""DNS discovery through dnspython's resolver, asking a loopback responder (tests/dnsserver.py)."""

from __future__ import annotations

from dnsserver import dns_responder
from router.config.discovery import DnsDiscoveryConfig
from router.discovery.dns import DnsSource

SVC = "vllm-decode.llm.svc.cluster.local"
SRV = "_http._tcp.vllm-prefill.llm.svc.cluster.local"


class Views:
    def __init__(self) -> None:
        self.published: list[list] = []

    async def __call__(self, source, instances):
        assert source == "dns"
        self.published.append(list(instances))


def source(responder, views, **target):
    host, port = responder.address
    config = DnsDiscoveryConfig.model_validate({"targets": [target], "nameservers": [f"{host}:{port}"], "timeout_s": 0.3})
    from router.discovery.dns import make_resolver

    return DnsSource(config, views, make_resolver(config))


async def test_a_records_of_a_headless_service_are_instances():
    with dns_responder() as responder:
        responder.set(SVC, "A", ["10.1.0.5", "10.1.0.4"])
        views = Views()
        src = source(responder, views, name=SVC, role="decode", defaults={"port": 8001, "model": "m"})
        found = await src.resolve_all()
        assert [(i.url, i.role, i.model) for i in found] == [("http://10.1.0.4:8001", "decode", "m"),
                                                              ("http://10.1.0.5:8001", "decode", "m")]
        assert (SVC + ".", "A") in responder.queries
        # unchanged: nothing published again; a pod leaves: published
        await src.resolve_all()
        responder.set(SVC, "A", ["10.1.0.4"])
        await src.resolve_all()
        assert [[i.url for i in p] for p in views.published] == [["http://10.1.0.4:8001", "http://10.1.0.5:8001"],
                                                                 ["http://10.1.0.4:8001"]]


async def test_srv_records_give_the_port_and_glue_or_a_lookup_the_address():
    with dns_responder() as responder:
        responder.set(SRV, "SRV", ["0 50 8100 p-0.vllm-prefill.llm.svc.cluster.local.",
                                   "0 50 8101 p-1.vllm-prefill.llm.svc.cluster.local."])
        responder.set("p-0.vllm-prefill.llm.svc.cluster.local", "A", ["10.2.0.1"])
        responder.set("p-1.vllm-prefill.llm.svc.cluster.local", "A", ["10.2.0.2"])
        views = Views()
        src = source(responder, views, name=SRV, role="prefill", srv=True)
        found = await src.resolve_all()
        assert sorted(i.url for i in found) == ["http://10.2.0.1:8100", "http://10.2.0.2:8101"]
        assert all(i.role == "prefill" for i in found)
        assert not any(t == "A" for _, t in responder.queries)  # the additional section sufficed
        responder.glue = False
        responder.set(SRV, "SRV", ["0 50 8100 p-0.vllm-prefill.llm.svc.cluster.local."])
        assert [i.url for i in await src.resolve_all()] == ["http://10.2.0.1:8100"]


async def test_a_missing_name_empties_but_a_silent_resolver_keeps_the_last_view():
    with dns_responder() as responder:
        responder.set(SVC, "A", ["10.1.0.4"])
        views = Views()
        src = source(responder, views, name=SVC)
        assert len(await src.resolve_all()) == 1
        responder.silent = True  # timeouts: a resolver blip must not empty the cluster
        assert len(await src.resolve_all()) == 1
        responder.silent = False
        responder.records.clear()  # NXDOMAIN: the service has no Ready pod
        assert await src.resolve_all() == []
        assert views.published[-1] == []
