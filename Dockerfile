# vllm_omni on stock vLLM 0.32.0 (CUDA). Not built in this repository's CI (no container runtime
# there); `hadolint Dockerfile` checks it (tests/test_dockerfile.py). docs/distributed.md says how
# to build, run and use it on several nodes.
#
#   docker build -t vllm-omni .
#   docker run --gpus all -p 8000:8000 -v /models:/models vllm-omni /models/Qwen-Image --omni
FROM vllm/vllm-openai:v0.32.0

# The base image already has vllm==0.32.0 (the vLLM this package pins), torch,
# transformers and Ray; this adds the package and its own dependencies (diffusers, accelerate).
WORKDIR /opt/vllm-omni
COPY pyproject.toml README.md ./
COPY vllm_omni ./vllm_omni
ARG VLLM_OMNI_VERSION=0.0.0
RUN SETUPTOOLS_SCM_PRETEND_VERSION="${VLLM_OMNI_VERSION}" \
    python3 -m pip install --no-cache-dir . \
    && python3 -c "from vllm_omni.plugin import check_vllm_version; check_vllm_version()"

WORKDIR /
# Arguments are appended: `docker run ... vllm-omni MODEL --omni [--cpp ...]`.
ENTRYPOINT ["vllm", "serve"]
