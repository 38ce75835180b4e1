"""Demo assets: a tiny trained Llama base model and PEFT LoRA adapters for several tenants.

``loraplex.demo.assets.generate_demo_assets`` builds (or reuses) a set; ``load_demo_assets``
reads one. Importing this package does not import torch; generation does.
"""
