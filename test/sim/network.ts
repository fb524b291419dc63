// The simulation's in-process network: a provider's WebSocket to the gateway as two ordered links with
// latency (a WebSocket is one TCP stream: frames arrive in the order sent), bound on the gateway's side
// to the handler Bun.serve would call (open, message, close) through a stand-in ServerWebSocket.
import type { WebSocketHandler } from "bun";
import type { SocketData } from "../../src/gateway/providerEndpoint.ts";
import type { SimClock } from "./clock.ts";
import type { Rng } from "../support/seededRandom.ts";

export interface ProviderEnd {
  /** A frame from the gateway. */
  onFrame(bytes: Uint8Array): void;
  /** The connection ended (the gateway closed it, or the gateway process died). */
  onClosed(code: number, reason: string): void;
}

/** One provider connection, from the dial to the close of either side. */
export class SimSocket {
  /** The provider sends nothing more (it dropped the connection or heard it close). */
  private providerDone = false;
  /** The gateway reads nothing more (it closed the socket, heard the drop, or died). */
  private gatewayDone = false;
  /** Delivery times of the last frame each way, so a link never reorders. */
  private lastToGateway = 0;
  private lastToProvider = 0;
  readonly ws: { data: SocketData; send(bytes: Uint8Array): number; close(code?: number, reason?: string): void };

  constructor(
    private readonly clock: SimClock,
    private readonly rng: Rng,
    private readonly handler: WebSocketHandler<SocketData>,
    private readonly peer: ProviderEnd,
  ) {
    const socket = this;
    this.ws = {
      data: {},
      send(bytes) {
        socket.toProvider(bytes);
        return bytes.byteLength;
      },
      close(code = 1000, reason = "") {
        socket.closeFromGateway(code, reason);
      },
    };
  }

  /** True while the provider may still send on it. */
  get isOpen(): boolean {
    return !this.providerDone;
  }

  /** Dials: the gateway's `open` runs after one link latency. */
  connect(): void {
    this.lastToGateway = this.clock.monotonic() + this.latency();
    this.clock.at(this.lastToGateway - this.clock.monotonic(), () => {
      if (!this.gatewayDone) this.handler.open?.(this.ws as never);
    });
  }

  private latency(): number {
    return 1 + this.rng.int(5);
  }

  private toGatewayAt(): number {
    const at = Math.max(this.lastToGateway, this.clock.monotonic() + this.latency());
    this.lastToGateway = at;
    return at - this.clock.monotonic();
  }

  private toProviderAt(): number {
    const at = Math.max(this.lastToProvider, this.clock.monotonic() + this.latency());
    this.lastToProvider = at;
    return at - this.clock.monotonic();
  }

  /** A frame from the provider; arrives in order, after the link's latency. */
  send(bytes: Uint8Array): void {
    if (this.providerDone) return;
    const copy = Buffer.from(bytes);
    this.clock.at(this.toGatewayAt(), () => {
      if (!this.gatewayDone) void this.handler.message?.(this.ws as never, copy as never);
    });
  }

  private toProvider(bytes: Uint8Array): void {
    if (this.gatewayDone) return;
    const copy = new Uint8Array(bytes);
    this.clock.at(this.toProviderAt(), () => {
      if (!this.providerDone) this.peer.onFrame(copy);
    });
  }

  /** The gateway closes: Bun calls the handler's `close` in a later turn; the provider hears it after its frames. */
  private closeFromGateway(code: number, reason: string): void {
    if (this.gatewayDone) return;
    this.gatewayDone = true;
    this.clock.at(0, () => void this.handler.close?.(this.ws as never, code, reason));
    this.clock.at(this.toProviderAt(), () => {
      if (this.providerDone) return;
      this.providerDone = true;
      this.peer.onClosed(code, reason);
    });
  }

  /** The provider drops the connection: the gateway reads what was sent before, then sees 1006. */
  drop(): void {
    if (this.providerDone) return;
    this.providerDone = true;
    this.clock.at(this.toGatewayAt(), () => {
      if (this.gatewayDone) return;
      this.gatewayDone = true;
      void this.handler.close?.(this.ws as never, 1006, "");
    });
  }

  /** The gateway process died: no handler runs any more; the provider sees the connection reset. */
  reset(): void {
    this.gatewayDone = true;
    this.clock.at(this.toProviderAt(), () => {
      if (this.providerDone) return;
      this.providerDone = true;
      this.peer.onClosed(1006, "reset");
    });
  }
}
