"""The running router's changeable parts: config applied live, instances that come and go.

One ``Live`` per app. Every change goes through it, whatever its origin (config file
watch, SIGHUP, admin API, a discovery source), so the rules are the same everywhere:

* a new config is validated first and refused whole (``Refused``/``ConfigError``) when
  invalid or when it touches a part that needs a restart; the running one stays;
* an accepted one is copied into the running ``RouterConfig`` in place, so every holder
  of one of its sections sees the new values at once, and what is derived from it (the
  policy object, timeouts, prefill rates) is rebuilt;
* membership changes register capacities with the store, health-check new instances
  before they take traffic, and drop a removed instance's residency and booked load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from router.config import changes
from router.config.changes import Refused
from router.config.model import ConfigError, InstanceConfig, RouterConfig, load_config
from router.core.health import HealthChecker
from router.core.instances import STATIC, Change, Instance, InstancePool
from router.core.metrics import Metrics
from router.discovery import start_sources
from router.request.service import RouterService
from router.scheduling import Policy, check_config
from router.state.base import StateStore
from router.state.store_tier import build_store_tier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveOptions:
    """How the app was started: the file to watch, worker processes, whether SIGHUP is ours."""

    config_path: str | None = None
    workers: int = 1
    sighup: bool = False


def _fingerprint(path: str) -> tuple[int, int, int] | None:
    """Identity of the file behind ``path`` (symlinks followed): a ConfigMap update swaps the
    ``..data`` symlink, which changes the inode even when size and mtime look alike."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class Live:
    def __init__(self, config: RouterConfig, pool: InstancePool, store: StateStore, checker: HealthChecker,
                 service: RouterService, metrics: Metrics, options: LiveOptions,
                 make_policy: Callable[[RouterConfig, bool], Policy]) -> None:
        self.config = config
        self._make_policy = make_policy  # the app's: the policy as the app built it, for a new config
        self.pool = pool
        self.store = store
        self.checker = checker
        self.service = service
        self.metrics = metrics
        self.options = options
        self._lock = asyncio.Lock()  # one change at a time
        self._tasks: set[asyncio.Task[Any]] = set()
        self._disaggregated = pool.disaggregated
        self._fingerprint = _fingerprint(options.config_path) if options.config_path else None
        self._sighup = False

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.options.config_path and self.config.reload.watch_file:
            self._spawn(self._watch_file(), "pd-router-config-watch")
        for name, runner in start_sources(self.config.discovery, self.sync).items():
            self._spawn(runner, f"pd-router-discovery-{name}")
        if self.options.sighup:
            try:
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
                self._sighup = True
            except (ValueError, RuntimeError, NotImplementedError) as exc:  # not the main thread, or no signals here
                log.warning("SIGHUP reload not available: %s", exc)

    async def stop(self) -> None:
        if self._sighup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed: %r", task.get_name(), task.exception())

    # -- config ----------------------------------------------------------------------------
    async def apply(self, new: RouterConfig, origin: str) -> list[str]:
        """Make ``new`` the running config; return the changed paths, or raise Refused."""
        async with self._lock:
            old_doc, new_doc = changes.dump(self.config), changes.dump(new)
            changed = changes.diff(old_doc, new_doc)
            if not changed:
                return []
            changes.check_live(changed)
            check_config(new)  # plugin names and parameters, before anything changes
            self._check_static_ids(new.instances)
            changes.apply_in_place(self.config, new, skip=frozenset({"instances"}))
            self.config.instances = list(new.instances)
            self.pool.reconfigure(self.config)
            p = self.config.proxy
            # RouterService derives its timeout once; the rest of it reads the config it holds.
            self.service.timeout = httpx.Timeout(p.request_timeout_s, connect=p.connect_timeout_s)
            membership = self._sync_locked(STATIC, new.instances)
            if any(c.startswith(("policy", "pd")) for c in changed) and not membership:
                self._rebuild_policy()
            if any(c.startswith(("kv_store", "pd.kv_bytes_per_token")) for c in changed):  # the belief starts over
                self.service.store_tier = build_store_tier(self.config.kv_store, self.config.pd.kv_bytes_per_token,
                                                           self.config.hashing.block_tokens)
            for path in changed:
                before, after = changes.redact(changes.lookup(old_doc, path), path), changes.redact(changes.lookup(new_doc, path), path)
                log.info("config change (%s): %s: %s -> %s", origin, path, _short(before), _short(after))
            return changed

    def _check_static_ids(self, instances: Sequence[InstanceConfig]) -> None:
        taken = {i.id: i.source for i in self.pool if i.source != STATIC}
        clashes = [f"instance {ic.id!r} is already known from {taken[ic.id]}" for ic in instances if ic.id in taken]
        if clashes:
            raise Refused("; ".join(clashes))

    async def patch(self, patch: dict[str, Any], origin: str) -> list[str]:
        """Apply a JSON merge patch to the running config (secrets sent back masked stay as they are)."""
        overridden = changes.env_overrides(changes.leaf_paths(patch), os.environ)
        if overridden:
            raise Refused("; ".join(f"{path} is set by the environment ({var}), which wins over the file and the admin API"
                                    for path, var in overridden.items()))
        current = changes.dump(self.config)
        new = changes.validate(changes.merge_patch(current, changes.unredact(patch, current)))
        return await self.apply(new, origin)

    async def reload_file(self, origin: str) -> list[str] | None:
        """Reload the config file; a bad one is logged and refused. None when nothing to reload."""
        path = self.options.config_path
        if not path:
            log.warning("%s: no config file to reload (started without --config)", origin)
            return None
        try:
            new = await asyncio.to_thread(load_config, path)
            changed = await self.apply(new, origin)
        except (ConfigError, Refused) as exc:
            log.error("config reload (%s) refused, the running config stays: %s", origin, exc)
            return None
        if not changed:
            log.info("config reload (%s): nothing changed", origin)
        return changed

    def _on_sighup(self) -> None:
        self._spawn(self.reload_file("SIGHUP"), "pd-router-sighup-reload")

    async def _watch_file(self) -> None:
        path = self.options.config_path
        assert path is not None
        while True:
            await asyncio.sleep(self.config.reload.poll_interval_s)
            seen = await asyncio.to_thread(_fingerprint, path)
            if seen is None or seen == self._fingerprint:
                continue  # a missing file (mid-swap) is not a change: the running config stays
            self._fingerprint = seen
            await self.reload_file("file change")

    # -- membership ------------------------------------------------------------------------
    async def sync(self, source: str, instances: Sequence[InstanceConfig]) -> Change:
        """Make ``instances`` the members of ``source`` (a discovery source's whole view)."""
        async with self._lock:
            return self._sync_locked(source, instances)

    def _sync_locked(self, source: str, instances: Sequence[InstanceConfig]) -> Change:
        change = self.pool.sync(source, instances, healthy=False)
        for inst in change.added + change.updated:
            self.store.set_capacity(inst.id, self.config.residency_cap(inst.config, inst.candidate.cache_tokens))
        for inst in change.added:
            self._spawn(self.checker.check(inst), f"pd-router-check-{inst.id}")
        for inst in change.removed:
            self._spawn(self._retire(inst), f"pd-router-retire-{inst.id}")
        if change:
            self._rebuild_policy()
            for instance_id, problem in self.pool.compat_report().items():
                log.warning("instance %s can never be paired: %s", instance_id, problem)
        return change

    async def _retire(self, inst: Instance) -> None:
        await self.store.drop_instance(inst.id)
        self.metrics.forget_engine(inst.id)
        self.service.calibrator.forget(inst.id)

    def _rebuild_policy(self) -> None:
        disaggregated = self.pool.disaggregated
        self.service.policy = self._make_policy(self.config, disaggregated)
        if disaggregated != self._disaggregated:
            log.info("cluster is now %s: policy %s rebuilt", "disaggregated (has prefill instances)" if disaggregated
                     else "colocated", self.service.policy.name)
            self._disaggregated = disaggregated

    def drain(self, instance_id: str, draining: bool) -> Instance:
        return self.pool.set_draining(instance_id, draining)


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

