// The gateway's arrival log of receipt envelopes (`receipts_received`), read straight from whichever
// store the test gateway runs on: the store has no reader for it (only `gateway receipts list`, which
// shows the deciding receipt), and tests about replays and forgeries must see every row it kept.
import { Database } from "bun:sqlite";
import { SQL } from "bun";
import { join } from "node:path";
import { flushTestGateways, knownBackends } from "./harness.ts";

export interface ReceiptLogRow {
  id: number;
  envelope: string;
  disposition: string;
}

/** The log's rows, oldest first (every request's, or one request's), of the gateway on `dataDir`. */
export async function receiptLog(dataDir: string, requestId?: string): Promise<ReceiptLogRow[]> {
  flushTestGateways();
  const { databaseUrl } = knownBackends(dataDir);
  if (databaseUrl) {
    const sql = new SQL(databaseUrl);
    try {
      const rows: ReceiptLogRow[] = requestId === undefined
        ? await sql`SELECT id, envelope, disposition FROM receipts_received ORDER BY id`
        : await sql`SELECT id, envelope, disposition FROM receipts_received WHERE request_id = ${requestId} ORDER BY id`;
      return rows.map((r) => ({ ...r, id: Number(r.id) }));
    } finally {
      await sql.close();
    }
  }
  const db = new Database(join(dataDir, "gateway.db"), { readonly: true });
  try {
    const where = requestId === undefined ? "" : " WHERE request_id = ?";
    return db.query(`SELECT id, envelope, disposition FROM receipts_received${where} ORDER BY id`).all(...(requestId === undefined ? [] : [requestId])) as ReceiptLogRow[];
  } finally {
    db.close();
  }
}
