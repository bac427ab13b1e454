"""One-line integrations for training loops a framework owns.

`phalanx.worker.integrations.lightning.PhalanxCallback` (PyTorch Lightning, extra `lightning`) and
`phalanx.worker.integrations.huggingface.PhalanxCallback` (Hugging Face Trainer, extra `huggingface`) build on
`phalanx.worker.session`. They are imported only by name, so importing phalanx.worker never imports a framework.
"""
