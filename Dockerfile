# The gateway as a container: the single binary (bun run build) on a small Debian base.
#   docker build -t gateway . && docker run -p 8080:8080 -v gateway-data:/var/lib/gateway gateway
# With PostgreSQL and Redis: deploy/compose.yaml (docs/operator.md, "Containers").
FROM oven/bun:1.4 AS build
WORKDIR /src
COPY package.json bun.lock ./
RUN bun install --frozen-lockfile
COPY . .
RUN bun run build

FROM debian:bookworm-slim
RUN useradd --system --home-dir /var/lib/gateway --shell /usr/sbin/nologin gateway \
 && mkdir -p /var/lib/gateway && chown gateway:gateway /var/lib/gateway && chmod 0700 /var/lib/gateway
COPY --from=build /src/dist/gateway /usr/local/bin/gateway
USER gateway
# Every setting also reads from GATEWAY_* (docs/configuration.md); these make it reachable in a container.
# MIMALLOC_PURGE_DELAY: Bun's allocator returns freed memory after 1 s, not 100 ms (docs/operator.md, "Allocator").
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_DATA_DIR=/var/lib/gateway \
    MIMALLOC_PURGE_DELAY=1000
VOLUME /var/lib/gateway
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["serve"]
