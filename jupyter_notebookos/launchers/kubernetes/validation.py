"""Validation of the values a kernel request carries (kernelspec config, ``KERNEL_*``): pure checks that raise
:class:`InvalidKernelRequest` naming the value, the rule it breaks and how to fix it, before any API call.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from jupyter_notebookos.launchers.base import RequestRefused

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$")
# Image references, following the grammar of github.com/distribution/reference.
_IMAGE_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_PATH = re.compile(rf"^{_IMAGE_PATH_COMPONENT}(?:/{_IMAGE_PATH_COMPONENT})*$")
_IMAGE_DOMAIN = re.compile(
    r"^(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(?::[0-9]+)?$|^\[[0-9a-fA-F:]+\](?::[0-9]+)?$"
)
_IMAGE_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_IMAGE_DIGEST = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")
_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MAX_ID = 4294967295  # uid_t / gid_t


class InvalidKernelRequest(RequestRefused):
    """A kernelspec or ``KERNEL_*`` value cannot make a valid pod; raised before any API call."""


def fail(what: str, value: object, why: str, fix: str) -> InvalidKernelRequest:
    return InvalidKernelRequest(f"{what} {value!r} {why}; {fix}")


def check_dns1123_label(what: str, value: str) -> str:
    """Return ``value`` if it is a DNS-1123 label (namespaces, volume names), else raise."""
    if not value or len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise fail(
            what,
            value,
            "is not a valid DNS-1123 label",
            "use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
        )
    return value


def check_dns1123_subdomain(what: str, value: str) -> str:
    """Return ``value`` if it is a DNS-1123 subdomain (pod, service account names), else raise."""
    if not value or len(value) > 253 or not _DNS1123_SUBDOMAIN.match(value):
        raise fail(
            what,
            value,
            "is not a valid DNS-1123 name",
            "use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        )
    return value


def check_label_value(what: str, value: str) -> str:
    """Return ``value`` if Kubernetes accepts it as a label value, else raise."""
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise fail(
            what,
            value,
            "cannot be a Kubernetes label value",
            "use at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        )
    return value


def check_image(what: str, value: str) -> str:
    """Return ``value`` if it is a valid container image reference (``[registry/]path[:tag][@digest]``)."""
    fix = "give an image like 'registry.example.com/team/notebookos-kernel:0.1.0'"
    if not value:
        raise InvalidKernelRequest(
            f"{what} is empty: no kernel image is configured; set the kernelspec's process_proxy "
            "config 'image_name', KERNEL_IMAGE, or KubernetesLauncher.image"
        )
    if len(value) > 4096 or value != value.strip():
        raise fail(what, value, "is not a valid image reference", fix)
    rest, _, digest = value.partition("@")
    if digest and not _IMAGE_DIGEST.match(digest):
        raise fail(what, value, f"has an invalid digest {digest!r}", fix)
    name, tag = rest, ""
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:
        name, tag = rest[:colon], rest[colon + 1 :]
        if not _IMAGE_TAG.match(tag):
            raise fail(what, value, f"has an invalid tag {tag!r}", fix)
    first, sep, remainder = name.partition("/")
    if sep and (any(c in first for c in ".:") or first == "localhost" or first.lower() != first):
        if not _IMAGE_DOMAIN.match(first):
            raise fail(what, value, f"has an invalid registry {first!r}", fix)
        path = remainder
    else:
        path = name
    if not path or len(path) > 255 or not _IMAGE_PATH.match(path):
        raise fail(what, value, "is not a valid image name (lowercase letters, digits, '.', '_', '-', '/')", fix)
    return value


def check_quantity(what: str, value: object) -> str:
    """Return ``value`` as a canonical-form string if it is a positive Kubernetes quantity, else raise."""
    text = str(value).strip()
    if isinstance(value, bool) or not _QUANTITY.match(text):
        raise fail(
            what,
            value,
            "is not a Kubernetes resource quantity",
            "use a positive number with an optional suffix, e.g. cpu '500m' or '2', memory '512Mi' or '4Gi'",
        )
    if parse_quantity(text) <= 0:
        raise fail(what, value, "must be greater than zero", "remove it to use the default, or give a size")
    return text


def quantity_value(text: str) -> Decimal:
    return Decimal(parse_quantity(text))


def check_int(what: str, value: object, low: int, high: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise fail(what, value, "is not an integer", f"give a whole number from {low} to {high}") from None
    if not low <= number <= high:
        raise fail(what, value, f"is out of range {low}..{high}", f"give a whole number from {low} to {high}")
    return number


def parse_structured(what: str, value: object) -> list[dict[str, Any]]:
    """Parse KERNEL_VOLUMES-style values: a list of mappings, or its JSON/YAML text (as EG accepts)."""
    parsed: object = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError as err:
                raise fail(what, value, f"is neither JSON nor YAML ({err})", "give a JSON list of objects") from None
    if parsed is None:
        return []
    if isinstance(parsed, Mapping):
        parsed = [parsed]
    if not isinstance(parsed, list) or not all(isinstance(item, Mapping) for item in parsed):
        raise fail(
            what,
            value,
            "is not a list of objects",
            'give e.g. [{"name": "data", "persistentVolumeClaim": {...}}]',
        )
    return [dict(item) for item in parsed]


def check_volumes(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], builtin: set[str]) -> None:
    names: set[str] = set()
    for volume in volumes:
        name = str(volume.get("name", ""))
        check_dns1123_label("KERNEL_VOLUMES entry name", name)
        if name in names or name in builtin:
            raise fail("KERNEL_VOLUMES entry name", name, "is used twice", "give every volume its own name")
        if len(volume) < 2:
            raise fail(
                "KERNEL_VOLUMES entry",
                volume,
                "has no volume source",
                "add one source, e.g. persistentVolumeClaim, nfs, configMap or emptyDir",
            )
        names.add(name)
    for mount in mounts:
        name, path = str(mount.get("name", "")), str(mount.get("mountPath", ""))
        if name not in names and name not in builtin:
            raise fail(
                "KERNEL_VOLUME_MOUNTS entry",
                mount,
                "names a volume that is not defined",
                f"define it in KERNEL_VOLUMES (defined: {sorted(names) or 'none'})",
            )
        if not path.startswith("/"):
            raise fail(
                "KERNEL_VOLUME_MOUNTS entry",
                mount,
                "has no absolute mountPath",
                "give e.g. '/home/jovyan/data'",
            )


# --- the deployer's allowlists (what a user's KERNEL_* request may ask for) -----------------------------------

#: The volume sources Pod Security Standard "restricted" admits (hostPath, nfs... are refused there).
RESTRICTED_VOLUME_TYPES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
#: What names a volume source, for the source patterns of :func:`check_volume_allowed`.
_SOURCE_NAME_FIELDS = {
    "persistentVolumeClaim": ("claimName",),
    "configMap": ("name",),
    "secret": ("secretName",),
    "nfs": ("server", "path"),
    "hostPath": ("path",),
    "csi": ("driver",),
}
_MOUNT_FIELDS = frozenset({"name", "mountPath", "readOnly", "subPath"})


def refuse(field_name: str, value: object, rule: str, fix: str) -> InvalidKernelRequest:
    """The error of a value the deployer's rule does not allow: names the field, the value and the rule."""
    return InvalidKernelRequest(f"{field_name} {value!r} is not allowed: {rule}; {fix}")


def matches_any(value: str, patterns: Sequence[str]) -> bool:
    """Whether ``value`` matches one of the shell-style ``patterns`` (``registry.example.com/team/*:*``)."""
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def volume_source_type(volume: Mapping[str, Any]) -> str:
    """The one source key of a volume (``persistentVolumeClaim``, ``emptyDir``...); raises if not exactly one."""
    sources = [key for key in volume if key != "name"]
    if len(sources) != 1:
        raise fail(
            "KERNEL_VOLUMES entry",
            dict(volume),
            f"has {len(sources)} volume sources",
            "give exactly one source, e.g. persistentVolumeClaim, configMap or emptyDir",
        )
    return sources[0]


def volume_source_name(kind: str, source: object) -> str:
    """What identifies a volume's source (a claim's name, ``server:path`` of NFS...), matched by source patterns."""
    if not isinstance(source, Mapping):
        return ""
    return ":".join(str(source.get(f, "")) for f in _SOURCE_NAME_FIELDS.get(kind, ()))


def check_volume_allowed(
    volume: Mapping[str, Any], allowed_types: Sequence[str], allowed_sources: Mapping[str, Sequence[str]]
) -> None:
    """Refuse a user's volume whose source type, or whose named source, the deployer's allowlists do not list."""
    kind = volume_source_type(volume)
    if kind not in allowed_types:
        raise refuse(
            f"KERNEL_VOLUMES entry {volume.get('name')!r} source type",
            kind,
            f"KubernetesLauncher.allowed_volume_types is {sorted(allowed_types)}",
            "use one of those types, or ask the deployer to allow this one",
        )
    patterns = allowed_sources.get(kind)
    if patterns is not None:
        name = volume_source_name(kind, volume[kind])
        if not matches_any(name, patterns):
            raise refuse(
                f"KERNEL_VOLUMES entry {volume.get('name')!r} {kind} source",
                name,
                f"KubernetesLauncher.allowed_volume_sources[{kind!r}] is {list(patterns)}",
                "use a source matching one of those patterns",
            )


def check_mount_allowed(mount: Mapping[str, Any]) -> None:
    """Refuse a user's mount with fields that reach beyond its volume (propagation, ``..`` in subPath)."""
    extra = sorted(set(mount) - _MOUNT_FIELDS)
    if extra:
        raise refuse(
            f"KERNEL_VOLUME_MOUNTS entry {mount.get('name')!r} field",
            extra[0],
            f"a kernel's mounts may set only {sorted(_MOUNT_FIELDS)}",
            "remove that field",
        )
    sub_path = str(mount.get("subPath", ""))
    if sub_path.startswith("/") or ".." in sub_path.split("/"):
        raise refuse(
            f"KERNEL_VOLUME_MOUNTS entry {mount.get('name')!r} subPath",
            sub_path,
            "a subPath must be relative and stay inside its volume",
            "give a relative path without '..'",
        )
