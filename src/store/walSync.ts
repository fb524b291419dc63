// Makes the SQLite write-ahead log durable off the event loop: `fdatasync` of the -wal file on the
// thread pool. Group commits of the request path commit with synchronous=NORMAL (a WAL append, safe
// against a process crash) and money-moving groups then wait here before their outside effects run,
// which gives them synchronous=FULL's power-loss durability without blocking the event loop
// (docs/decisions.md, "Durability tiers").

import { closeSync, fdatasync, openSync } from "node:fs";

/** Asks for every WAL frame written so far to reach the disk; `done(false)` when the sync failed. */
export type SyncWal = (done: (ok: boolean) => void) => void;

export interface WalSyncer {
  sync: SyncWal;
  close(): void;
}

/**
 * A syncer of the WAL at `walPath`. Requests coalesce: a request made while a sync runs waits for
 * the next one (the running sync may have started before the request's frames were written), and
 * all requests waiting for that next sync share it.
 */
export function walSyncer(walPath: string, sync: typeof fdatasync = fdatasync): WalSyncer {
  let fd: number | null = null;
  let running = false;
  let queued: ((ok: boolean) => void)[] = [];
  const start = () => {
    const batch = queued;
    queued = [];
    running = true;
    try {
      fd ??= openSync(walPath, "r");
    } catch {
      running = false;
      for (const done of batch) done(false);
      return;
    }
    sync(fd, (error) => {
      running = false;
      for (const done of batch) done(!error);
      if (queued.length > 0) start();
    });
  };
  return {
    sync: (done) => {
      queued.push(done);
      if (!running) start();
    },
    close: () => {
      if (fd !== null) closeSync(fd);
      fd = null;
    },
  };
}
