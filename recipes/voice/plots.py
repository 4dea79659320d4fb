"""Loss curves of a checkpoint's history as PNG (for docs/)."""

from __future__ import annotations

from pathlib import Path


def _series(history: list[dict], key: str, index: int | None = None):
    xs, ys = [], []
    for row in history:
        value = row.get(key)
        if value is None:
            continue
        if index is not None:
            if not isinstance(value, list) or index >= len(value):
                continue
            value = value[index]
        xs.append(row["step"])
        ys.append(value)
    return xs, ys


def plot_codec(history: list[dict], out: Path, title: str = "codec") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key in ("mel", "heldout_mel"):
        axes[0].plot(*_series(history, key), label=key, marker="o" if key.startswith("heldout") else None)
    axes[0].set_title("multi-scale mel L1 (sum of scales)")
    for key in ("wave", "commit", "codebook", "latent_rms"):
        axes[1].plot(*_series(history, key), label=key)
    axes[1].set_yscale("log")
    axes[1].set_title("waveform L1, VQ terms, encoder output RMS")
    for key in ("d", "adv", "feat"):
        axes[2].plot(*_series(history, key), label=key)
    axes[2].set_title("adversarial")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)


def plot_lm(history: list[dict], out: Path, num_codebooks: int, title: str = "speech LM") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(*_series(history, "loss"), label="train")
    axes[0].plot(*_series(history, "heldout_loss"), label="held out", marker="o")
    axes[0].set_title("cross-entropy (mean of codebooks)")
    for k in range(num_codebooks):
        axes[1].plot(*_series(history, "stream_loss", k), label=f"cb {k}")
    axes[1].set_title("train loss per codebook")
    for k in range(num_codebooks):
        axes[2].plot(*_series(history, "heldout_stream_acc", k), label=f"cb {k}", marker=".")
    axes[2].set_title("held-out accuracy per codebook")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return Path(out)
