"""An S3-compatible object store for tests: moto's S3 server (real HTTP, signed requests, IAM auth enforced) in this
process. What runs here: no MinIO or AWS can (docs/security.md says what moto does not check)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Store:
    endpoint: str
    access_key: str
    secret_key: str = ""
    bucket: str = "notebookos"

    def env(self) -> dict[str, str]:
        """The gateway's environment for this store (botocore reads these)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": REGION,
        }

    def fs(self) -> Any:
        """An s3fs filesystem with the store's keys (the test's view, as the gateway has it)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=self.access_key, secret=self.secret_key, endpoint_url=self.endpoint, skip_instance_cache=True
        )


@contextlib.contextmanager
def s3_store(bucket: str = "notebookos") -> Iterator[S3Store]:
    """moto's server with one bucket and one IAM user allowed everything (the store's admin keys); every other
    request must be signed with a known key."""
    import boto3
    import requests
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        requests.post(f"{endpoint}/moto-api/reset", timeout=30).raise_for_status()
        # The next 3 requests (making the admin user) go unchecked; every later one needs a valid signature.
        requests.post(f"{endpoint}/moto-api/config", json={"iam": {"initial_no_auth_action_count": 3}}, timeout=30)
        setup = {"endpoint_url": endpoint, "region_name": REGION}
        iam = boto3.client("iam", aws_access_key_id="AKIASETUP0000000000", aws_secret_access_key="setup", **setup)
        iam.create_user(UserName="gateway")
        everything = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="gateway", PolicyName="admin", PolicyDocument=json.dumps(everything))
        key = iam.create_access_key(UserName="gateway")["AccessKey"]
        store = S3Store(endpoint, key["AccessKeyId"], key["SecretAccessKey"], bucket)
        boto3.client(
            "s3", aws_access_key_id=store.access_key, aws_secret_access_key=store.secret_key, **setup
        ).create_bucket(Bucket=bucket)
        yield store
    finally:
        server.stop()


@contextlib.contextmanager
def s3_store_in_environment(bucket: str = "notebookos") -> Iterator[S3Store]:
    """:func:`s3_store`, with its address and keys in this process's environment, as a gateway has them: an
    in-process platform or broker with an ``s3://`` URL talks to it, never to AWS (whose credential lookup and
    requests take seconds, or hang where the network drops them)."""
    import os

    import s3fs

    with s3_store(bucket) as started:
        # fsspec keeps filesystems by their arguments: one made before (other tests' gateways, without this
        # store's address in the environment) must not be reused for this store, nor ours after it.
        s3fs.S3FileSystem.clear_instance_cache()
        old = {k: os.environ.get(k) for k in started.env()}
        os.environ.update(started.env())
        try:
            yield started
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            for key, value in old.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@dataclass
class BrokerServer:
    """The gateway's object broker handler alone, on a loop thread of this process, for one kernel."""

    url: str  # what replicas get as NOTEBOOKOS_OBJECT_BROKER_URL
    token: str  # the kernel's object token
    platform: Any  # what the handler reads: object_broker, kernels, ready

    def stop(self) -> None:
        """Close the listener and every connection (as a gateway process that ends does), then the loop."""
        import asyncio

        async def close() -> None:
            self.platform.server.stop()
            await self.platform.server.close_all_connections()

        asyncio.run_coroutine_threadsafe(close(), self.platform.loop).result(30)
        self.platform.loop.call_soon_threadsafe(self.platform.loop.stop)


def serve_broker(store_url: str, kernel_id: str, port: int, *, ready: bool = True, expires: int = 900) -> BrokerServer:
    """Serve the gateway's broker handlers with the real broker for ``store_url`` (S3, or a ``file://`` store it
    serves itself) on 127.0.0.1:``port``, as a gateway with one kernel, ``kernel_id``, does (``ready=False``: a
    gateway still starting)."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from tornado.httpserver import HTTPServer
    from tornado.web import Application

    from jupyter_notebookos.gateway.control.access import KernelAccess
    from jupyter_notebookos.gateway.control.objectbroker import broker_handlers, make_broker

    access = KernelAccess(kernel_id)
    url = f"http://127.0.0.1:{port}/api/notebookos/kernels"
    platform = SimpleNamespace(
        object_broker=None, kernels={kernel_id: SimpleNamespace(access=access)}, loop=None, server=None
    )
    started = threading.Event()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        platform.loop = loop
        platform.ready = asyncio.Event()
        if ready:
            platform.ready.set()
        platform.object_broker = make_broker(store_url, url, expires)
        platform.server = HTTPServer(Application(broker_handlers(), notebookos_platform=platform))
        platform.server.listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    threading.Thread(target=serve, daemon=True, name=f"broker-{port}").start()
    if not started.wait(30):
        raise RuntimeError("the object broker did not start")
    return BrokerServer(url, access.object_token, platform)
