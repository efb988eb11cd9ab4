/**
 * Turns a bearer token into a principal: a static token (TASKRELAY_AUTH_TOKENS, compared in constant time) or a JWT
 * access token from the configured OAuth issuer (validated with `jose` against its JWKS). Both may be on at once.
 * The token itself goes no further than `req.auth` (the SDK hands that to handlers); it is never logged, and workers
 * get the principal only.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { errors as joseErrors, createRemoteJWKSet, jwtVerify, type JWTPayload } from 'jose';
import { InvalidTokenError, ServerError } from '@modelcontextprotocol/sdk/server/auth/errors.js';
import type { OAuthTokenVerifier } from '@modelcontextprotocol/sdk/server/auth/provider.js';
import type { AuthInfo } from '@modelcontextprotocol/sdk/server/auth/types.js';
import type { Logger, OAuthConfig } from '@taskrelay/shared';

/**
 * Asymmetric algorithms only: a JWKS publishes public keys, so an HS* token "signed" with one of them, or `none`,
 * is never accepted.
 */
export const ALLOWED_JWT_ALGORITHMS = [
  'RS256',
  'RS384',
  'RS512',
  'PS256',
  'PS384',
  'PS512',
  'ES256',
  'ES384',
  'ES512',
  'EdDSA',
  'Ed25519',
];

/** A static token's auth lasts one request; the SDK middleware requires an expiry. */
const STATIC_TOKEN_EXPIRY_S = 3600;

export interface TokenVerifierOptions {
  /** token → principal (TASKRELAY_AUTH_TOKENS). */
  staticTokens: Map<string, string> | undefined;
  oauth: OAuthConfig | undefined;
  log: Logger;
}

/** The principal of an OAuth token: issuer and subject, so two issuers' `sub`s never meet. */
export function oauthPrincipal(issuer: string, subject: string): string {
  return `${issuer}#${subject}`;
}

export class TokenVerifier implements OAuthTokenVerifier {
  private readonly staticDigests: Array<{ digest: Buffer; principal: string }>;
  private readonly jwks: ReturnType<typeof createRemoteJWKSet> | undefined;

  constructor(private readonly options: TokenVerifierOptions) {
    this.staticDigests = [...(options.staticTokens ?? new Map<string, string>())].map(([token, principal]) => ({
      digest: digest(token),
      principal,
    }));
    this.jwks = options.oauth
      ? createRemoteJWKSet(new URL(options.oauth.jwksUrl), {
          cooldownDuration: options.oauth.jwksCooldownMs,
          cacheMaxAge: 10 * 60_000,
          timeoutDuration: 5_000,
        })
      : undefined;
  }

  async verifyAccessToken(token: string): Promise<AuthInfo> {
    const principal = this.matchStatic(token);
    if (principal !== undefined) {
      return {
        token,
        clientId: principal,
        // An operator-issued token carries every scope the gateway requires.
        scopes: this.options.oauth?.requiredScopes ?? [],
        expiresAt: Math.floor(Date.now() / 1000) + STATIC_TOKEN_EXPIRY_S,
      };
    }
    if (!this.jwks || !this.options.oauth) throw new InvalidTokenError('Invalid bearer token');
    return this.verifyJwt(token, this.jwks, this.options.oauth);
  }

  /** Compares against every configured token (no early exit) through fixed-length digests. */
  private matchStatic(token: string): string | undefined {
    const candidate = digest(token);
    let found: string | undefined;
    for (const entry of this.staticDigests) {
      if (timingSafeEqual(candidate, entry.digest)) found = entry.principal;
    }
    return found;
  }

  private async verifyJwt(
    token: string,
    jwks: ReturnType<typeof createRemoteJWKSet>,
    oauth: OAuthConfig,
  ): Promise<AuthInfo> {
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, jwks, {
        issuer: oauth.issuer,
        audience: oauth.audience,
        algorithms: ALLOWED_JWT_ALGORITHMS,
        clockTolerance: Math.round(oauth.clockSkewMs / 1000),
        requiredClaims: ['exp', 'sub'],
      }));
    } catch (error) {
      throw this.describe(error);
    }
    const sub = payload.sub;
    if (typeof sub !== 'string' || sub === '') throw new InvalidTokenError('Token has no subject');
    return {
      token,
      clientId: oauthPrincipal(oauth.issuer, sub),
      scopes: scopesOf(payload),
      // A dashboard login made with it ends when it does (docs/OPERATIONS.md).
      extra: { via: 'oauth' },
      // The SDK middleware compares this with the clock as it is: give it the same skew jose allowed.
      expiresAt: (payload.exp ?? 0) + Math.round(oauth.clockSkewMs / 1000),
    };
  }

  /** Stable, quote-free messages (they go into WWW-Authenticate); the key set's troubles are the server's. */
  private describe(error: unknown): Error {
    if (error instanceof joseErrors.JWTExpired) return new InvalidTokenError('Token has expired');
    if (error instanceof joseErrors.JWTClaimValidationFailed) {
      return new InvalidTokenError(`Token claim ${error.claim} is not valid here`);
    }
    if (error instanceof joseErrors.JWKSTimeout || error instanceof joseErrors.JWKSInvalid) {
      this.options.log.warn({ err: error }, 'authorization server keys unavailable');
      return new ServerError('Authorization server keys unavailable');
    }
    if (error instanceof joseErrors.JOSEError) {
      this.options.log.debug({ code: error.code }, 'bearer token rejected');
      return new InvalidTokenError('Invalid bearer token');
    }
    // A failed JWKS fetch (network) surfaces as a plain error.
    this.options.log.warn({ err: error }, 'token verification failed');
    return new ServerError('Authorization server keys unavailable');
  }
}

function digest(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}

function scopesOf(payload: JWTPayload): string[] {
  const { scope, scp } = payload as { scope?: unknown; scp?: unknown };
  if (typeof scope === 'string') return scope.split(/\s+/).filter(Boolean);
  if (Array.isArray(scp)) return scp.filter((s): s is string => typeof s === 'string');
  return [];
}
