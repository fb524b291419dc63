// GET /v1/catalog, /v1/catalog.sig and /v1/catalog/pubkey (docs/catalog.md): plain functions returning a
// Response, mounted by the HTTP app. The body is served as the exact signed bytes, never re-encoded.
// ETag = the body digest (for .sig too: one signature per body), so pollers revalidate with
// If-None-Match for a 304 instead of downloading the feed each time.
import { errorResponse, gatewayError } from "../http/errors.ts";
import type { CatalogState } from "./state.ts";

export interface CatalogHttpSource {
  current(): CatalogState | null;
  readonly publicKeyRaw: Uint8Array;
}

const etagOf = (state: CatalogState) => `"${state.body_digest}"`;

/** True when the request's If-None-Match names `etag` (or is `*`); weak validators compare equal. */
function notModified(request: Request, etag: string): boolean {
  const header = request.headers.get("if-none-match");
  if (header === null) return false;
  return header.split(",").some((tag) => {
    const t = tag.trim().replace(/^W\//, "");
    return t === "*" || t === etag;
  });
}

function noCatalog(requestId: string): Response {
  return errorResponse(gatewayError("not_found", "No catalog has been published yet."), requestId);
}

function catalogHeaders(state: CatalogState, requestId: string, contentType: string): Record<string, string> {
  return {
    "content-type": contentType,
    // Revalidate every time (cheap with the ETag): a retired model must not linger in caches.
    "cache-control": "no-cache",
    etag: etagOf(state),
    "x-catalog-id": state.catalog_id,
    "x-catalog-body-digest": state.body_digest,
    "x-request-id": requestId,
  };
}

function serve(source: CatalogHttpSource, request: Request, requestId: string, contentType: string, payload: (s: CatalogState) => Uint8Array | string): Response {
  const state = source.current();
  if (state === null) return noCatalog(requestId);
  const headers = catalogHeaders(state, requestId, contentType);
  if (notModified(request, headers.etag!)) return new Response(null, { status: 304, headers });
  return new Response(request.method === "HEAD" ? null : payload(state), { status: 200, headers });
}

/** GET /v1/catalog: catalog.json's exact bytes. */
export function handleCatalog(source: CatalogHttpSource, request: Request, requestId: string): Response {
  return serve(source, request, requestId, "application/json", (s) => s.bytes);
}

/**
 * GET /v1/catalog.sig: the base64 signature of the body GET /v1/catalog serves now. Fetching both is
 * two requests; if the catalog changes between them the pair fails to verify (compare X-Catalog-Id)
 * and the client fetches again.
 */
export function handleCatalogSignature(source: CatalogHttpSource, request: Request, requestId: string): Response {
  return serve(source, request, requestId, "text/plain; charset=utf-8", (s) => s.signature);
}

/** GET /v1/catalog/pubkey: standard padded base64 of the raw 32-byte operator Ed25519 key. */
export function handleCatalogPublicKey(source: CatalogHttpSource, _request: Request, requestId: string): Response {
  return new Response(Buffer.from(source.publicKeyRaw).toString("base64"), {
    status: 200,
    headers: { "content-type": "text/plain; charset=utf-8", "cache-control": "no-cache", "x-request-id": requestId },
  });
}
