// Generated secrets (gateway HMAC key, …): created once, then read back on every start.

import type { Database } from "bun:sqlite";
import type { RandomBytes } from "./ids.ts";

export function getOrCreateSecret(db: Database, random: RandomBytes, name: string, byteLength: number): Uint8Array {
  if (!Number.isInteger(byteLength) || byteLength < 1) throw new Error(`invalid secret length ${byteLength}`);
  return db
    .transaction(() => {
      // INSERT OR IGNORE: when another process created it first, its value stands.
      db.query("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)").run(name, random(byteLength));
      const row = db.query("SELECT value FROM secrets WHERE name = ?").get(name) as { value: Uint8Array };
      // A different length means two callers disagree about what the secret is: a bug, not data.
      if (row.value.length !== byteLength) {
        throw new Error(`secret ${name} holds ${row.value.length} bytes, caller expects ${byteLength}`);
      }
      return row.value;
    })
    .immediate();
}
