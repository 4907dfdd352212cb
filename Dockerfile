# agentstream service image for docker-compose.yml (the at-scale path).
FROM python:3.11-slim
WORKDIR /app
# CPU build of PyTorch first, so nothing pulls CUDA wheels into the image.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY clients ./clients
COPY producers ./producers
COPY streams ./streams
COPY consumers ./consumers
COPY infra ./infra
RUN pip install --no-cache-dir '.[train]'
ENV AGENTSTREAM_DATA_DIR=/data
VOLUME /data
CMD ["agentstream", "--help"]
