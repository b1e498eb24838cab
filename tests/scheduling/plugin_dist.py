"""A plugin distribution installed for real: a temporary sys.path entry holding a module and
a ``*.dist-info`` with entry points, as pip would leave it."""

import importlib.metadata
import sys
import textwrap

from router.scheduling.registry import ENTRY_POINT_GROUP

PLUGIN_MODULE = '''
from router.scheduling.registry import NoParams, Params, plugin


class Reverse(Params):
    offset: float = 0.0


class ReverseIndexScorer:
    """Prefers the last candidate: a scorer no built-in plugin could stand in for."""

    name = "reverse_index"

    def __init__(self, offset):
        self.offset = offset

    def score(self, req, routes):
        return [self.offset + i for i in range(len(routes))]


@plugin("scorer", "reverse_index", Reverse)
def reverse_index(params, ctx):
    """Higher for later candidates."""
    return ReverseIndexScorer(params.offset)


@plugin("preset", "last_one")
def last_one(params, ctx):
    """The last candidate, always."""
    from router.config.model import PipelineConfig
    return PipelineConfig(scorers=[{"name": "reverse_index"}], picker={"name": "first_max"})
'''


def install(tmp_path, monkeypatch, entry_points, modules=None, dist="acme-router-plugins"):
    """A distribution ``dist`` on a fresh sys.path entry with these entry points."""
    for name, source in (modules or {}).items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    info = tmp_path / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in modules or {}:
        monkeypatch.delitem(sys.modules, name, raising=False)
    return [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.dist and ep.dist.name == dist]
