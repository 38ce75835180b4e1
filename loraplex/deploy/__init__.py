"""Kubernetes manifests for loraplex (``loraplex k8s render``), torch-free.

``K8sSpec`` (``spec.py``) is the validated input; ``render`` (``render.py``) turns it into the
replica Deployment and Service (``replica.py``), the InferencePool and its endpoint picker
(``pool.py``) or, for the Ray path, a KubeRay RayService (``ray.py``), written as YAML by
``yaml_text.py``. Imports ``serve.config`` only, to check pass-through serve settings.
"""

from loraplex.deploy.render import Rendered, render
from loraplex.deploy.spec import K8sSpec, SpecError

__all__ = ["K8sSpec", "Rendered", "SpecError", "render"]
