"""Notebook-friendly progress bars for the round loop (``tqdm.auto``)."""
from __future__ import annotations

from typing import Callable, Optional

from tqdm.auto import tqdm


class RoundProgress:
    """An ``on_round_end`` callback for :func:`fedlib.engine.run_federated` showing a bar.

    The bar's postfix shows the last training loss and, when evaluated, the selection
    metric. Use as a context manager so the bar closes even when training stops early::

        with RoundProgress(config.rounds, "FedMF") as progress:
            run = run_federated(..., on_round_end=progress)
    """

    def __init__(self, total: int, description: str = "rounds", metric: Optional[str] = None,
                 then: Optional[Callable] = None):
        self.bar = tqdm(total=total, desc=description, leave=False)
        self.metric, self.then = metric, then

    def __call__(self, run, record: dict) -> None:
        self.bar.n = run.round_index
        postfix = {"loss": f"{record.get('train_loss', float('nan')):.4f}"}
        key = f"valid/{self.metric}" if self.metric else next((k for k in record if k.startswith("valid/")), None)
        if key and key in record:
            postfix[key.split("/", 1)[1]] = f"{record[key]:.4f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()
        if self.then is not None:
            self.then(run, record)

    def __enter__(self) -> "RoundProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
