"""The network: backbones and tokenizers (backbone.py), the backbone adapter, the one module that knows
each encoder family (adapter.py, its table in families.py), layer-stack surgery (layers.py), backbone
steps such as duplication (steps.py, duplication.py), the task heads and losses every method
shares (heads.py) and the layer redundancy probe (probe.py, which reads dev batches from data/).
Above data (model > data); methods' contract types (methods/contract.py) are below it.
May import: base, config, methods, data
"""
