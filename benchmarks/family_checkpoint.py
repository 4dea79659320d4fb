"""A real-size checkpoint of a published family with random weights, codec included, for the
end-to-end benches (`speechctl bench --workload --model DIR --random-weights`): the LM as a config only (vLLM's
``load_format="dummy"`` makes its weights), the codec at its published shape with random
weights (speed does not depend on their values).

    python benchmarks/family_checkpoint.py higgs_audio_v2 /tmp/higgs-3b
    python benchmarks/family_checkpoint.py csm /tmp/csm-1b
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("family", choices=["higgs_audio_v2", "csm"])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.family == "higgs_audio_v2":
        from speechctl.models.higgs.checkpoint import HIGGS_3B_WITH_TOKENIZER, create_higgs_checkpoint

        # the tokenizer's published shape: 25 frames/s, 8 codebooks x 1024
        create_higgs_checkpoint(args.out, HIGGS_3B_WITH_TOKENIZER)
    else:
        import torch
        from safetensors.torch import save_file
        from transformers import MimiConfig, MimiModel

        from speechctl.models.csm.checkpoint import CSM_1B, create_csm_checkpoint

        path = create_csm_checkpoint(args.out, CSM_1B)
        mimi = MimiModel(MimiConfig(num_quantizers=32)).eval()  # Mimi's published shape
        save_file({f"codec_model.{k}": v.contiguous() for k, v in mimi.state_dict().items()}, str(path / "model.safetensors"))
        del torch
    print(args.out)


if __name__ == "__main__":
    main()
