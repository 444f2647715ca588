# The ledger image: the API (`ledger serve`), the collectors (`ledger collect`) and the CLI.
# The inference engine runs in its own image (vllm/vllm-openai); see docker-compose.yml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY ledger ledger
COPY collectors collectors
COPY api api
COPY migrations migrations
COPY cli cli
COPY fixture_model fixture_model
RUN pip install --no-cache-dir -c constraints.txt . \
    && useradd --system --uid 10001 ledger \
    && mkdir -p /data /spool /secrets && chown ledger /data /spool /secrets
USER ledger
ENTRYPOINT ["ledger"]
CMD ["serve"]
