import type { MiddlewareHandler } from "hono";
import { sha256 } from "../core/_crypto.ts";
import { EdgelockError } from "../core/errors.ts";
import type { AppEnv, TenantStores } from "./_env.ts";
import type { TenantLimiter } from "./_limits.ts";
import { isOperatorRoute } from "./routes/ops.ts";
import { InvalidRange } from "../core/_invalid.ts";

/** One tenant's API key. */
export interface ApiKey {
  /** The tenant: 1–64 characters of `A-Z a-z 0-9 _ -`; it names the tenant's Redis key prefix. */
  tenant: string;
  /** The Bearer secret, at least 16 characters. */
  secret: string;
}

const TENANT_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
const SECRET_PATTERN = /^[\x21-\x7e]{16,256}$/;

/** Parses `LOCK_API_KEYS`: comma-separated `tenant:secret` pairs. Throws on any malformed pair. */
export function parseApiKeys(text: string | undefined): ApiKey[] {
  const keys = parseKeys(text, "LOCK_API_KEYS", "tenant");
  if (keys.length === 0) {
    throw new InvalidRange(
      "LOCK_API_KEYS is not set: give comma-separated tenant:secret pairs, each secret 16–256 " +
        "printable characters (e.g. from `openssl rand -base64 24`)",
    );
  }
  if (new Set(keys.map((key) => key.secret)).size !== keys.length) {
    throw new InvalidRange("LOCK_API_KEYS: two tenants share a secret");
  }
  return keys;
}

/**
 * Parses `OPERATOR_API_KEYS`, in the same `name:secret` form (none when unset): operators read
 * every tenant's stats and may break locks. No operator shares a secret with a tenant.
 */
export function parseOperatorKeys(
  text: string | undefined,
  tenants: readonly ApiKey[] = [],
): ApiKey[] {
  const keys = parseKeys(text, "OPERATOR_API_KEYS", "operator");
  const secrets = new Set(tenants.map((key) => key.secret));
  if (new Set(keys.map((key) => key.secret)).size !== keys.length) {
    throw new InvalidRange("OPERATOR_API_KEYS: two operators share a secret");
  }
  if (keys.some((key) => secrets.has(key.secret))) {
    throw new InvalidRange("OPERATOR_API_KEYS: an operator shares a secret with a tenant");
  }
  return keys;
}

function parseKeys(text: string | undefined, setting: string, who: string): ApiKey[] {
  return (text ?? "").split(",").map((pair) => pair.trim()).filter(Boolean).map((pair) => {
    const at = pair.indexOf(":");
    const tenant = pair.slice(0, at);
    const secret = pair.slice(at + 1);
    if (at < 1 || !TENANT_PATTERN.test(tenant)) {
      throw new InvalidRange(
        `${setting}: each entry is ${who}:secret, the ${who} 1–64 characters of A-Z a-z 0-9 _ -`,
      );
    }
    if (!SECRET_PATTERN.test(secret) || secret.includes(",")) {
      throw new InvalidRange(
        `${setting}: the secret of ${who} "${tenant}" must be 16–256 printable characters ` +
          "without commas",
      );
    }
    return { tenant, secret };
  });
}

/**
 * Finds the tenant whose secret is `presented`. Both sides are compared as SHA-256 digests with
 * a constant-time loop over every key, so neither the position nor the length of a mismatch
 * shows in the timing.
 */
export async function findTenant(
  keys: readonly { tenant: string; digest: Uint8Array }[],
  presented: string,
): Promise<string | undefined> {
  const digest = await sha256(presented);
  let found: string | undefined;
  for (const key of keys) {
    let diff = 0;
    for (let i = 0; i < digest.length; i++) diff |= digest[i]! ^ key.digest[i]!;
    if (diff === 0) found = key.tenant;
  }
  return found;
}

// Operators are found as `operator:<name>`, which no tenant name can be (no colon).
const OPERATOR = "operator:";
// RFC 9110 §11.1: the scheme is case-insensitive; one or more spaces before the credentials.
const BEARER = /^bearer +([\x21-\x7e]{1,256})$/i;

/**
 * The middleware that finds the caller by its Bearer key and sets its role, tenant and stores:
 * a tenant's key works on its own tenant within its limits; an operator's key on the operator
 * routes only, of the tenant it names with `?tenant=`.
 */
export function authenticator(
  apiKeys: readonly ApiKey[],
  operatorKeys: readonly ApiKey[],
  byTenant: ReadonlyMap<string, TenantStores>,
  limiter: TenantLimiter,
): MiddlewareHandler<AppEnv> {
  const digests = Promise.all([
    ...apiKeys.map(async ({ tenant, secret }) => ({ tenant, digest: await sha256(secret) })),
    ...operatorKeys.map(async ({ tenant, secret }) => ({
      tenant: `${OPERATOR}${tenant}`,
      digest: await sha256(secret),
    })),
  ]);
  // A key that matched once is found again without hashing: the map holds only the service's
  // own keys, so it cannot grow past them.
  const known = new Map<string, string>();
  const principalOf = async (presented: string | undefined) => {
    if (presented === undefined) return undefined;
    let principal = known.get(presented);
    if (principal === undefined) {
      principal = await findTenant(await digests, presented);
      if (principal !== undefined) known.set(presented, principal);
    }
    return principal;
  };
  return async (c, next) => {
    const presented = BEARER.exec(c.req.header("authorization") ?? "")?.[1];
    const principal = await principalOf(presented);
    if (!principal) {
      throw new EdgelockError(
        "unauthorized",
        presented === undefined
          ? "Send Authorization: Bearer <api key>"
          : "The API key was refused: it is none of this service's keys (LOCK_API_KEYS, OPERATOR_API_KEYS)",
      );
    }
    c.set("tenants", byTenant);
    const asked = c.req.query("tenant");
    let tenant = principal;
    if (principal.startsWith(OPERATOR)) {
      c.set("role", "operator");
      c.set("operator", principal.slice(OPERATOR.length));
      if (!isOperatorRoute(c.req.method, c.req.path)) {
        throw new EdgelockError(
          "forbidden",
          "An operator key reads stats, lists and the audit, and breaks locks; lock with a " +
            "tenant's key",
        );
      }
      if (asked === undefined) return await next();
      if (!byTenant.has(asked)) throw new EdgelockError("not_found", "No such tenant");
      tenant = asked;
    } else {
      c.set("role", "tenant");
      if (asked !== undefined && asked !== principal) {
        throw new EdgelockError("forbidden", "A tenant's key reads only its own tenant");
      }
      limiter.admit(tenant);
    }
    c.set("tenant", tenant);
    const { locks, ops, records, jobs, wait, charge } = byTenant.get(tenant)!;
    c.set("locks", locks);
    c.set("ops", ops);
    c.set("records", records);
    c.set("jobs", jobs);
    c.set("wait", wait);
    c.set("charge", c.get("role") === "tenant" ? charge : () => {});
    await next();
  };
}
