"""KV memory: ``blocks.BlockManager`` (torch-free block tables, refcounts, prefix reuse per
adapter revision) and ``paged.PagedKVCache`` (the key/value tensors over those blocks)."""
