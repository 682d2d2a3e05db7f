"""NotebookOS on Kubernetes: replica pods, GPU nodes as hosts, placeholder pods for scaling.

The only module tree that imports the ``kubernetes`` client. Manifests come from the pure builders in
:mod:`.objects`; :class:`~.launcher.KubernetesLauncher` creates replica pods,
:class:`~.nodes.NodeInventory` follows GPU nodes, and :class:`~.placeholders.PlaceholderPool` turns the
autoscaler's target into placeholder pods, which :class:`~.provisioner.PlaceholderProvisioner` asks for.
"""

from jupyter_notebookos.launchers.kubernetes.launcher import KubernetesLauncher
from jupyter_notebookos.launchers.kubernetes.nodes import GpuNode, NodeEvent, NodeEventKind, NodeInventory
from jupyter_notebookos.launchers.kubernetes.placeholders import PlaceholderPool, PlaceholderScaling
from jupyter_notebookos.launchers.kubernetes.provisioner import PlaceholderProvisioner
from jupyter_notebookos.launchers.kubernetes.validation import InvalidKernelRequest

__all__ = [
    "GpuNode",
    "InvalidKernelRequest",
    "KubernetesLauncher",
    "NodeEvent",
    "NodeEventKind",
    "NodeInventory",
    "PlaceholderPool",
    "PlaceholderProvisioner",
    "PlaceholderScaling",
]
