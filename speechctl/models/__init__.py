"""Model families speechctl runs on vLLM, registered out of tree.

``register`` is vLLM's ``vllm.general_plugins`` entry point: vLLM calls it in every process it
starts, and the engine calls it too. Registration is by string, so nothing is imported (and no
device is touched) until vLLM needs the class.
"""

ARCHITECTURES = {
    "SpeechctlMultiStreamLM": "speechctl.models.multistream:MultiStreamForCausalLM",
}


def register() -> None:
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
