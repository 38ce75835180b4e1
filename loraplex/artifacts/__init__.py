"""What an adapter is (torch-free): identity (``AdapterKey``), the base model's spec, manifest and
config parsing, validation of the safetensors file, and the content-addressed ``ArtifactStore``.

The registry (control plane) and the runtime both import this package; it imports neither.
"""
