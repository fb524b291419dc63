// Where finished retry results outlive this process's memory (issue 21 item 3, docs/quotas.md "Retries"):
// a SQLite file in the embedded mode (a retry after a restart is replayed), Redis in a cluster (a retry
// that lands on another node is replayed, and an Idempotency-Key in flight on one node is refused on
// every other one). The in-memory cache (idempotency.ts) stays the first place looked in.

/** A finished, successful result as a retry gets it. */
export interface StoredResult {
  fingerprint: string;
  status: number;
  /** Header name/value pairs, flat. */
  headers: string[];
  /** The body as kept: whole, or in the compact form of a templated stream (`expandBody` makes it whole). */
  body: ArrayBuffer;
}

export type SharedEntry = { state: "in_flight"; fingerprint: string } | ({ state: "succeeded" } & StoredResult);

export interface ReplayBackend {
  /**
   * Whether `finished` may be given a body in its compact form, kept as is and expanded when replayed;
   * otherwise it gets the whole body (a backend other processes read: they may run other code).
   */
  readonly keepsCompact?: boolean;
  /**
   * Claims an Idempotency-Key for a new run: null when this run may go ahead, else what holds the key
   * (a run in flight elsewhere, or a finished result), or "unavailable" when the backend cannot answer.
   */
  claim(keyId: string, fingerprint: string): Promise<SharedEntry | null | "unavailable">;
  /** The latest result of a retry-marked body (null: none, or still running elsewhere and not waited for). */
  latest(fingerprint: string): Promise<SharedEntry | null | "unavailable">;
  /** A run without a key started: retries of its body now find it in flight. */
  started(fingerprint: string): void;
  /**
   * A run ended: its result when it may be replayed, else null (the key and body run fresh next time).
   * A backend that keeps it in another process returns a promise that settles once that process has
   * answered (never rejecting); the caller may order its own writes after it.
   */
  finished(keyId: string | null, fingerprint: string, result: StoredResult | null): void | Promise<void>;
}
