"""Model families speechctl runs on vLLM, registered out of tree.

``register`` is vLLM's ``vllm.general_plugins`` entry point: vLLM calls it in every process it
starts, and the engine calls it too. Registration is by string, so nothing is imported (and no
device is touched) until vLLM needs the class.
"""

ARCHITECTURES = {
    "SpeechctlMultiStreamLM": "speechctl.models.multistream:MultiStreamForCausalLM",
    # transformers' checkpoint format of Higgs Audio v2 (see speechctl.models.families)
    "HiggsAudioV2ForConditionalGeneration": "speechctl.models.higgs_audio_v2:HiggsAudioV2ForConditionalGeneration",
    "CsmForConditionalGeneration": "speechctl.models.csm:CsmForConditionalGeneration",
}


def register() -> None:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
