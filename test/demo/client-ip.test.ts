// The client-IP rule (pure): the socket peer, or X-Forwarded-For only through trusted proxies, taking
// the right-most untrusted entry; and the /32 or /64 key per-IP limits count against.
import { describe, expect, test } from "bun:test";
import { ipKey, parseTrustedProxies, resolveClientIp, type TrustedProxies } from "../../src/http/clientIp.ts";

const trusted = (spec: string): TrustedProxies => {
  const parsed = parseTrustedProxies(spec);
  if (!parsed.ok) throw new Error(parsed.message);
  return parsed.proxies;
};

const PROXIES = "127.0.0.1, 10.0.0.0/8, ::1, fd00::/8";

describe("resolveClientIp", () => {
  test.each([
    // [what, socket, x-forwarded-for, trusted, expected]
    ["no proxies trusted: the socket peer, header ignored", "203.0.113.9", "198.51.100.1", "", "203.0.113.9"],
    ["untrusted peer: a forged header is ignored", "203.0.113.9", "198.51.100.1", PROXIES, "203.0.113.9"],
    ["trusted peer without the header: the peer", "127.0.0.1", null, PROXIES, "127.0.0.1"],
    ["trusted peer: the entry it appended", "127.0.0.1", "198.51.100.7", PROXIES, "198.51.100.7"],
    ["client-typed entries left of the first untrusted one are ignored", "127.0.0.1", "6.6.6.6, 198.51.100.7", PROXIES, "198.51.100.7"],
    ["a chain of trusted proxies is skipped from the right", "10.0.0.2", "6.6.6.6, 198.51.100.7, 10.1.2.3, 10.0.0.1", PROXIES, "198.51.100.7"],
    ["every entry trusted: the left-most", "10.0.0.2", "10.9.9.9, 10.0.0.1", PROXIES, "10.9.9.9"],
    ["a malformed entry stops the walk at the last trusted hop", "127.0.0.1", "198.51.100.7, not-an-ip", PROXIES, "127.0.0.1"],
    ["legacy IPv4 shorthand is not an address", "127.0.0.1", "127.1", PROXIES, "127.0.0.1"],
    ["IPv4-mapped IPv6 socket address is its IPv4 address", "::ffff:203.0.113.9", null, "", "203.0.113.9"],
    ["IPv4-mapped trusted proxy matches its IPv4 range", "::ffff:127.0.0.1", "198.51.100.7", PROXIES, "198.51.100.7"],
    ["IPv6 through a trusted IPv6 proxy, canonicalised", "::1", "2001:DB8:0:0:0:0:0:1", PROXIES, "2001:db8::1"],
    ["IPv6 proxy range", "fd12::5", "2001:db8::7", PROXIES, "2001:db8::7"],
    ["several header lines arrive joined by commas", "127.0.0.1", "6.6.6.6, 198.51.100.7", PROXIES, "198.51.100.7"],
    ["unknown socket address", null, "198.51.100.7", PROXIES, null],
  ] as const)("%s", (_what, socket, header, spec, expected) => {
    expect(resolveClientIp(socket, header, trusted(spec))).toBe(expected);
  });
});

describe("ipKey", () => {
  test.each([
    ["203.0.113.9", "203.0.113.9/32"],
    ["::ffff:203.0.113.9", "203.0.113.9/32"],
    ["2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"],
    ["2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"],
    ["::1", "::/64"],
    ["127.1", null],
    ["fe80::1%eth0", null],
    ["nonsense", null],
  ] as const)("%s → %s", (ip, key) => {
    expect(ipKey(ip)).toBe(key);
  });
});

describe("parseTrustedProxies", () => {
  test.each(["10.0.0.0/33", "::1/129", "example.com", "10.0.0.0/x", "1.2.3"])("refuses %s", (spec) => {
    expect(parseTrustedProxies(spec).ok).toBe(false);
  });

  test("empty or absent trusts nobody", () => {
    for (const spec of [undefined, "", " , "]) {
      const parsed = parseTrustedProxies(spec);
      expect(parsed.ok && parsed.proxies.ranges.length).toBe(0);
    }
  });
});
