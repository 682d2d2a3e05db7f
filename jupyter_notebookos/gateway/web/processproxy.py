"""``NotebookOSProcessProxy``: how Enterprise Gateway starts a NotebookOS kernel.

The kernelspec selects it through ``metadata.process_proxy.class_name``, as EG expects. EG's kernel manager
has already chosen the kernel's five ports and HMAC key (the connection info every client uses); instead of
running the kernelspec's argv, the proxy asks the platform to bind the kernel's replica router at that
connection info and start the replicas. To EG the router then *is* the kernel process: ``poll`` reports
whether it lives, ``send_signal(SIGINT)`` interrupts the running cell, ``kill`` stops every replica.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from enterprise_gateway.services.processproxies.processproxy import BaseProcessProxyABC, LocalProcessProxy
from jupyter_client.connect import ConnectionFileMixin
from tornado import web

from jupyter_notebookos.gateway.control.gatewayplatform import GatewayPlatform, KernelRequestError
from jupyter_notebookos.gateway.router import ReplicaRouter
from jupyter_notebookos.launchers.base import LaunchError, RequestRefused


def adopt_ports(km: Any, ports: dict[str, int]) -> None:
    """Give the kernel manager ``km`` the ports its router bound at and rewrite its connection file.

    Before the launch returns, so every client the gateway connects (and jupyter_client's control socket)
    uses them. jupyter_client's own writer is called: EG's override would pick five new ports."""
    for channel, port in ports.items():
        setattr(km, f"{channel}_port", port)
    km.cleanup_connection_file()
    ConnectionFileMixin.write_connection_file(km)


class NotebookOSProcessProxy(LocalProcessProxy):
    """A NotebookOS kernel: a replica router in the gateway, replicas on distinct hosts."""

    def __init__(self, kernel_manager: Any, proxy_config: dict[str, Any]) -> None:
        super().__init__(kernel_manager, proxy_config)
        self.router: ReplicaRouter | None = None
        self._stopping: asyncio.Future[None] | None = None
        self._interrupt: asyncio.Future[None] | None = None

    async def launch_process(self, kernel_cmd: str, **kwargs: Any) -> NotebookOSProcessProxy:
        """Start the kernel's router and replicas instead of a local process."""
        await BaseProcessProxyABC.launch_process(self, kernel_cmd, **kwargs)  # env, KERNEL_ID, authorization
        km = self.kernel_manager
        env: dict[str, str] = dict(kwargs.get("env") or {})
        ports = {
            "shell": km.shell_port,
            "iopub": km.iopub_port,
            "stdin": km.stdin_port,
            "control": km.control_port,
            "hb": km.hb_port,
        }
        timeout = self._launch_timeout(env)
        self._check_replica_count()
        try:
            gpus = parse_kernel_gpus(env.get("KERNEL_GPUS"))
            self.router = await GatewayPlatform.current().start_kernel(
                kernel_id=self.kernel_id,
                kernel_name=km.kernel_name,
                ip=km.ip,
                ports=ports,
                key=km.session.key,
                signature_scheme=km.session.signature_scheme,
                env=env,
                gpus=gpus,
                launch_timeout=timeout,
                # Every key of the kernelspec's process_proxy.config reaches the launcher (image, resources...);
                # the launcher lets the kernel's KERNEL_* variables override them, as EG documents.
                config=dict(self.proxy_config or {}),
                port_range=(self.lower_port, self.upper_port),
            )
        except (KernelRequestError, RequestRefused) as err:  # the user's request: theirs to fix
            raise web.HTTPError(400, str(err)) from err
        except LaunchError as err:
            raise web.HTTPError(500, str(err)) from err
        if self.router.ports != ports:
            adopt_ports(km, self.router.ports)
        self.ip = km.ip
        self.log.info(
            "NotebookOS kernel %s is up: router at %s, replicas %s",
            self.kernel_id,
            km.ip,
            ", ".join(f"{r.replica_id}@{r.host}" for r in self.router.replicas.registrations().values()),
        )
        return self

    def _launch_timeout(self, env: dict[str, str]) -> float | None:
        """``KERNEL_LAUNCH_TIMEOUT`` or the kernelspec's ``launch_timeout``, checked; None when neither is given
        (the platform's and the launcher's own defaults apply)."""
        raw = env.get("KERNEL_LAUNCH_TIMEOUT") or self.proxy_config.get("launch_timeout")
        if raw is None or raw == "":
            return None
        try:
            timeout = float(raw)
        except (TypeError, ValueError):
            raise web.HTTPError(
                400,
                f"launch timeout {raw!r} (KERNEL_LAUNCH_TIMEOUT or the kernelspec's "
                "process_proxy.config.launch_timeout) is not a number of seconds",
            ) from None
        if timeout <= 0:
            raise web.HTTPError(400, f"launch timeout {timeout:g} must be more than 0 seconds")
        return timeout

    def _check_replica_count(self) -> None:
        """The kernelspec's ``replicas`` must be what this gateway's scheduler runs (one count per gateway)."""
        wanted = self.proxy_config.get("replicas")
        if wanted is None:
            return
        runs = GatewayPlatform.current().scheduler.settings.replicas
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
            raise web.HTTPError(
                400,
                f"kernelspec {self.kernel_manager.kernel_name}: process_proxy.config.replicas "
                f"must be a whole number of replicas (1 or more), not {wanted!r}",
            )
        if wanted != runs:
            raise web.HTTPError(
                400,
                f"kernelspec {self.kernel_manager.kernel_name} asks for {wanted} replicas per kernel but this gateway "
                f"runs {runs} (c.Scheduler.replicas_per_kernel); make them agree",
            )

    def poll(self) -> int | None:
        """``None`` while the kernel lives (a quorum of replicas, or recovering), else an exit code."""
        if self.router is None:
            return 0
        return self.router.poll()

    def wait(self) -> int | None:
        return self.poll()

    def send_signal(self, signum: int) -> bool | None:
        if signum == 0:
            return None if self.poll() is None else False
        if self.router is None:
            return None
        if signum == signal.SIGINT:
            self._interrupt = asyncio.ensure_future(self.router.interrupt())
        else:
            self._stop(now=signum == signal.SIGKILL)
        return None

    def kill(self) -> bool | None:
        self._stop(now=True)
        return None

    def terminate(self) -> bool | None:
        self._stop(now=False)
        return None

    def cleanup(self) -> None:
        self._stop(now=True)

    def _stop(self, *, now: bool) -> None:
        if self.router is None or self._stopping is not None:
            return
        self.router.begin_shutdown(exited=True)
        self._stopping = GatewayPlatform.current().stop_kernel_soon(self.kernel_id, now=now)

    def load_process_info(self, process_info: dict[str, Any]) -> None:
        """Re-attach (gateway restart): the platform has already rebuilt this kernel's router."""
        super().load_process_info(process_info)
        record = GatewayPlatform.current().kernels.get(self.kernel_id)
        self.router = record.router if record is not None else None

    def get_process_info(self) -> dict[str, Any]:
        info = super().get_process_info()
        info["notebookos"] = True
        return info


def parse_kernel_gpus(raw: str | None) -> int:
    """``KERNEL_GPUS`` (EG's convention): GPUs per cell, default 1, 0 for CPU-only kernels."""
    if raw is None or raw.strip() == "":
        return 1
    try:
        gpus = int(raw)
    except ValueError:
        raise KernelRequestError(f"KERNEL_GPUS={raw!r} is not a whole number of GPUs per cell") from None
    if gpus < 0:
        raise KernelRequestError(f"KERNEL_GPUS={gpus}: a kernel cannot ask for fewer than 0 GPUs")
    return gpus
