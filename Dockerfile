# One image for both processes (multi-stage: the runtime stage has production dependencies and dist only, and runs as
# the non-root `node` user); docker-compose.yml picks the entry point with `command`:
#   node packages/gateway/dist/main.js   (the default)
#   node packages/worker/dist/main.js
#   node packages/cli/dist/main.js       (the CLI: `docker compose exec gateway node packages/cli/dist/main.js tools`)
# Every package under packages/ is copied in (its manifest in base, its sources in build, its dist in runtime):
# test/deploy-image.test.ts fails when one is missing, and replays this file end to end.
ARG NODE_IMAGE=node:20-slim
ARG PNPM_VERSION=12.4.2

# ---- base: Node plus the pinned pnpm (other versions refuse the lockfile) ----
FROM ${NODE_IMAGE} AS base
ARG PNPM_VERSION
ENV CI=true
RUN npm install -g "pnpm@${PNPM_VERSION}" && npm cache clean --force
WORKDIR /app
# Manifests first, so the dependency layers are reused until they change.
COPY package.json pnpm-lock.yaml pnpm-workspace.yaml .npmrc ./
COPY packages/shared/package.json packages/shared/
COPY packages/worker/package.json packages/worker/
COPY packages/gateway/package.json packages/gateway/
COPY packages/cli/package.json packages/cli/

# ---- build: every dependency, then the one build (scripts/build.mjs: tsc -b, then the Lua commands) ----
FROM base AS build
RUN pnpm install --frozen-lockfile
COPY tsconfig.base.json ./
COPY scripts/build.mjs scripts/
COPY packages/shared packages/shared
COPY packages/worker packages/worker
COPY packages/gateway packages/gateway
COPY packages/cli packages/cli
RUN pnpm build

# ---- prod-deps: runtime dependencies only ----
FROM base AS prod-deps
RUN pnpm install --frozen-lockfile --prod

# ---- runtime ----
FROM ${NODE_IMAGE} AS runtime
ENV NODE_ENV=production \
    HOST=0.0.0.0 \
    PORT=3000
WORKDIR /app
COPY --from=prod-deps --chown=node:node /app ./
COPY --from=build --chown=node:node /app/packages/shared/dist packages/shared/dist
COPY --from=build --chown=node:node /app/packages/worker/dist packages/worker/dist
COPY --from=build --chown=node:node /app/packages/gateway/dist packages/gateway/dist
COPY --from=build --chown=node:node /app/packages/cli/dist packages/cli/dist
# A tools module mounted from outside /app (TASKRELAY_TOOLS=/tools/tools.js) imports '@taskrelay/worker' and 'zod':
# Node looks for node_modules in every parent directory up to /node_modules, so they resolve from there. A module
# with other dependencies brings its own node_modules beside it.
RUN mkdir -p /node_modules/@taskrelay \
 && ln -s /app/packages/worker /node_modules/@taskrelay/worker \
 && ln -s /app/packages/shared /node_modules/@taskrelay/shared \
 && ln -s "$(readlink -f /app/packages/worker/node_modules/zod)" /node_modules/zod
USER node
EXPOSE 3000
STOPSIGNAL SIGTERM
CMD ["node", "packages/gateway/dist/main.js"]
