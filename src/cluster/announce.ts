// Changes an operator command makes (`gateway keys revoke`, `providers ban`, …) announced to every
// node of a cluster on the change channel, so they take effect everywhere within a second instead of
// at the next cache miss (docs/scale-out.md, "Changes").
import { RedisClient } from "bun";
import type { ChangeMessage } from "./messages.ts";
import { clusterChannel } from "./redis.ts";

/** The change channel, named through clusterChannel (scoped to the URL's database). */
export const CHANGES_CHANNEL = "changes";

/** Publishes the changes; false when Redis could not be reached (the store change itself stands). */
export async function announceChanges(redisUrl: string, changes: readonly ChangeMessage[]): Promise<boolean> {
  if (changes.length === 0) return true;
  const client = new RedisClient(redisUrl, { enableOfflineQueue: false, connectionTimeout: 2000, autoReconnect: false });
  try {
    await client.connect();
    for (const change of changes) await client.publish(clusterChannel(redisUrl, CHANGES_CHANNEL), JSON.stringify(change));
    return true;
  } catch {
    return false;
  } finally {
    client.close();
  }
}
