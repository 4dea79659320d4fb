# Sourced by the GPU scripts. vLLM registers speechctl's models in every process it starts (the
# workers of tensor parallelism too) through the package's entry point (pyproject.toml:
# vllm.general_plugins), which an installed speechctl has. On the GPU machine speechctl runs from
# the checkout on PYTHONPATH, with no installed metadata: write the entry point's metadata there.
dist=/tmp/speechctl-entry-point/speechctl-0.1.0.dist-info
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: speechctl\nVersion: 0.1.0\n' > "$dist/METADATA"
printf '[vllm.general_plugins]\nspeechctl = speechctl.models:register\n' > "$dist/entry_points.txt"
export PYTHONPATH=/tmp/speechctl-entry-point${PYTHONPATH:+:$PYTHONPATH}
