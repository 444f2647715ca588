# The ledger image: the API (`ledger serve`), the collectors (`ledger collect`) and the CLI.
# The inference engine runs in its own image (vllm/vllm-openai); see docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md LICENSE ./
COPY ledger ledger
COPY collectors collectors
COPY client client
COPY demo demo
COPY api api
COPY migrations migrations
COPY cli cli
COPY fixture_model fixture_model
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --system --uid 10001 ledger \
    && mkdir -p /data /spool /secrets && chown ledger /data /spool /secrets
USER ledger
# The API's health (a collector's own health check is in Dockerfile.collector and compose).
HEALTHCHECK --interval=10s --timeout=5s --start-period=2m --retries=6 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LEDGER_PORT', '8700'))"]
ENTRYPOINT ["ledger"]
CMD ["serve"]
