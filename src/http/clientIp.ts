// The buyer's network address: the socket's peer, or — only when that peer is a proxy the operator
// trusts — the right-most X-Forwarded-For entry that no trusted proxy wrote. Everything here is pure;
// the socket address comes from Bun's `server.requestIP(request)` at the edge (src/compositionRoot.ts).
//
// Why right-most: each proxy appends the address it received the connection from, so entries to the
// right were written by proxies we trust, while anything to the left of the first untrusted entry may
// have been typed by the client itself (and so is spoofable).
import ipaddr from "ipaddr.js";

type Address = ipaddr.IPv4 | ipaddr.IPv6;

/** Parsed `trustedProxies` setting: addresses and CIDR ranges of proxies whose X-Forwarded-For counts. */
export interface TrustedProxies {
  readonly ranges: readonly (readonly [Address, number])[];
}

export const NO_TRUSTED_PROXIES: TrustedProxies = { ranges: [] };

/**
 * Parses a strict textual address: dotted-quad IPv4 or IPv6 (an IPv4-mapped IPv6 address becomes its
 * IPv4 address). Null for anything else — including the legacy IPv4 shorthands (`127.1`, `0x7f.0.0.1`)
 * that `ipaddr.parse` would accept, since no proxy writes those and they only help spoofing.
 */
export function parseAddress(text: string): Address | null {
  const trimmed = text.trim();
  if (ipaddr.IPv4.isValidFourPartDecimal(trimmed)) return ipaddr.IPv4.parse(trimmed);
  if (!ipaddr.IPv6.isValid(trimmed)) return null;
  const v6 = ipaddr.IPv6.parse(trimmed);
  if (v6.zoneId !== undefined) return null;
  return v6.isIPv4MappedAddress() ? v6.toIPv4Address() : v6;
}

/** Canonical text of an address: dotted quad, or RFC 5952 for IPv6. */
export function formatAddress(address: Address): string {
  return address.kind() === "ipv4" ? address.toString() : (address as ipaddr.IPv6).toRFC5952String();
}

/**
 * Parses the `trustedProxies` setting: a comma-separated list of addresses and CIDR ranges
 * (`10.0.0.0/8, 127.0.0.1, ::1`). An empty or absent value trusts nobody.
 */
export function parseTrustedProxies(spec: string | undefined): { ok: true; proxies: TrustedProxies } | { ok: false; message: string } {
  if (spec === undefined || spec.trim() === "") return { ok: true, proxies: NO_TRUSTED_PROXIES };
  const ranges: [Address, number][] = [];
  for (const raw of spec.split(",")) {
    const item = raw.trim();
    if (item === "") continue;
    const slash = item.indexOf("/");
    const address = parseAddress(slash >= 0 ? item.slice(0, slash) : item);
    if (!address) return { ok: false, message: `trustedProxies: ${JSON.stringify(item)} is not an IP address or CIDR range` };
    const max = address.kind() === "ipv4" ? 32 : 128;
    const bitsText = slash >= 0 ? item.slice(slash + 1) : String(max);
    const bits = /^\d{1,3}$/.test(bitsText) ? Number(bitsText) : NaN;
    if (!(bits >= 0 && bits <= max)) return { ok: false, message: `trustedProxies: ${JSON.stringify(item)} has an invalid prefix length` };
    ranges.push([address, bits]);
  }
  return { ok: true, proxies: { ranges } };
}

function isTrusted(address: Address, proxies: TrustedProxies): boolean {
  return proxies.ranges.some(([range, bits]) => range.kind() === address.kind() && address.match(range, bits));
}

/**
 * The client's address in canonical text, or null when the socket address is unknown or unparseable.
 * - Socket peer not a trusted proxy: the socket peer (X-Forwarded-For is ignored: anyone can send it).
 * - Otherwise walk X-Forwarded-For from the right, skipping trusted proxies; the first untrusted entry
 *   is the client. All entries trusted: the left-most. A malformed entry stops the walk at the last
 *   address known good (a trusted proxy), so garbage can never choose the client's identity.
 */
export function resolveClientIp(socketAddress: string | null, forwardedFor: string | null, proxies: TrustedProxies): string | null {
  const peer = socketAddress === null ? null : parseAddress(socketAddress);
  if (!peer) return null;
  if (!isTrusted(peer, proxies) || !forwardedFor) return formatAddress(peer);
  let client = peer;
  const hops = forwardedFor.split(",");
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = parseAddress(hops[i]!);
    if (!hop) break;
    client = hop;
    if (!isTrusted(hop, proxies)) break;
  }
  return formatAddress(client);
}

/**
 * The unit a per-IP limit counts: an IPv4 address as its /32, an IPv6 address as its /64 (one
 * subscriber typically holds a whole /64 and rotates addresses inside it). `1.2.3.4/32`,
 * `2001:db8:1:2::/64`. Null for text that is not an address.
 */
export function ipKey(ip: string): string | null {
  const address = parseAddress(ip);
  if (!address) return null;
  if (address.kind() === "ipv4") return `${address.toString()}/32`;
  const parts = (address as ipaddr.IPv6).parts.slice(0, 4).concat([0, 0, 0, 0]);
  return `${new ipaddr.IPv6(parts).toRFC5952String()}/64`;
}
