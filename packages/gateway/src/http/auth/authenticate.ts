/**
 * Authentication for every route that needs it (/mcp, /metrics, /admin): the SDK's `requireBearerAuth` over
 * taskrelay's verifier (static tokens and/or OAuth JWTs), and the RFC 9728 Protected Resource Metadata that its 401s
 * point to when OAuth is on.
 */
import { Router, type RequestHandler } from 'express';
import { requireBearerAuth } from '@modelcontextprotocol/sdk/server/auth/middleware/bearerAuth.js';
import { metadataHandler } from '@modelcontextprotocol/sdk/server/auth/handlers/metadata.js';
import { getOAuthProtectedResourceMetadataUrl } from '@modelcontextprotocol/sdk/server/auth/router.js';
import { InsufficientScopeError } from '@modelcontextprotocol/sdk/server/auth/errors.js';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import type { GatewayConfig, Logger } from '@taskrelay/shared';
import { TokenVerifier } from './token-verifier.js';

export interface Authenticator {
  /** True when static tokens or OAuth are configured. */
  readonly enabled: boolean;
  /**
   * Requires a valid bearer token and sets `req.auth` (principal in `clientId`); a pass-through when authentication
   * is off. Mount it in front of anything that is not a probe.
   */
  readonly requireAuth: RequestHandler;
  /**
   * After `requireAuth`: lets only operators (`TASKRELAY_OPERATORS`) through, and answers every other principal 403.
   * With authentication on and no operators listed, nobody gets through. A pass-through when authentication is off:
   * the operator pages then follow the loopback rules of `/mcp` (Host and Origin checks).
   */
  readonly requireOperator: RequestHandler;
  /** Serves `/.well-known/oauth-protected-resource[/<path>]` when OAuth is on; an empty router otherwise. */
  readonly metadataRouter: Router;
  /**
   * Checks a token as `requireAuth` checks a bearer header (a static token, or an OAuth access token with the required
   * scopes): the dashboard's login form (docs/OPERATIONS.md). Throws the SDK's `InvalidTokenError`,
   * `InsufficientScopeError` or `ServerError`; undefined when authentication is off.
   */
  readonly verify: ((token: string) => Promise<AuthInfo>) | undefined;
}

const passThrough: RequestHandler = (_req, _res, next) => next();

export function createAuthenticator(
  config: Pick<GatewayConfig, 'authTokens' | 'oauth'> & Partial<Pick<GatewayConfig, 'operators'>>,
  log: Logger,
): Authenticator {
  const metadataRouter = Router();
  const enabled = config.authTokens !== undefined || config.oauth !== undefined;
  if (!enabled) {
    return { enabled, requireAuth: passThrough, requireOperator: passThrough, metadataRouter, verify: undefined };
  }
  const verifier = new TokenVerifier({ staticTokens: config.authTokens, oauth: config.oauth, log });
  const { oauth } = config;
  let resourceMetadataUrl: string | undefined;
  if (oauth) {
    const resource = new URL(oauth.audience);
    resourceMetadataUrl = getOAuthProtectedResourceMetadataUrl(resource);
    const metadata = {
      resource: oauth.audience,
      authorization_servers: [oauth.issuer],
      bearer_methods_supported: ['header'],
      ...(oauth.requiredScopes.length > 0 ? { scopes_supported: oauth.requiredScopes } : {}),
      resource_name: 'taskrelay gateway',
    };
    // RFC 9728 §3.1: the path-specific location, plus the root one for clients that look there.
    metadataRouter.use(new URL(resourceMetadataUrl).pathname, metadataHandler(metadata));
    metadataRouter.use('/.well-known/oauth-protected-resource', metadataHandler(metadata));
  }
  const requireAuth = requireBearerAuth({
    verifier,
    requiredScopes: oauth?.requiredScopes ?? [],
    ...(resourceMetadataUrl === undefined ? {} : { resourceMetadataUrl }),
  });
  const requiredScopes = oauth?.requiredScopes ?? [];
  const verify = async (token: string): Promise<AuthInfo> => {
    const info = await verifier.verifyAccessToken(token);
    if (!requiredScopes.every((scope) => info.scopes.includes(scope))) {
      throw new InsufficientScopeError(`Token lacks a required scope (${requiredScopes.join(' ')})`);
    }
    return info;
  };
  return { enabled, requireAuth, requireOperator: operatorsOnly(config.operators ?? []), metadataRouter, verify };
}

/** 403 for every authenticated principal not in `operators` (the pages show every principal's tasks). */
export function operatorsOnly(operators: readonly string[]): RequestHandler {
  const allowed = new Set(operators);
  return (req, res, next) => {
    const principal = (req as { auth?: { clientId?: string } }).auth?.clientId;
    if (principal !== undefined && allowed.has(principal)) return next();
    res.status(403).json({
      error: 'forbidden',
      error_description:
        allowed.size === 0
          ? 'operators only, and no operator is configured (TASKRELAY_OPERATORS)'
          : 'operators only (TASKRELAY_OPERATORS)',
    });
  };
}
