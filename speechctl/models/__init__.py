"""Model families speechctl runs on vLLM, registered out of tree.

``register`` is vLLM's ``vllm.general_plugins`` entry point: vLLM calls it in every process it
starts, and the engine calls it too. Registration is by string (each family's ``model_class``), so
nothing is imported (and no device is touched) until vLLM needs the class.
"""


def register() -> None:
    from vllm import ModelRegistry

    from speechctl.models.families import FAMILIES

    supported = set(ModelRegistry.get_supported_archs())
    for arch, family in FAMILIES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, family.model_class)
