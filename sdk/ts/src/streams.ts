import { LoamError, StreamEndedError } from './errors.js'
import { Deadline, Socket, bytes } from './transport.js'
import { MAX_PORT_MESSAGE } from './types.js'

/**
 * EventStream is a stream of JSON events (a file or port watch): iterate it
 * with for await. Breaking out of the loop, or close(), ends the watch. The
 * loop ends when the server ends the watch normally; it throws
 * StreamInterruptedError when a checkpoint or restore ended it.
 */
export class EventStream<T> implements AsyncIterable<T> {
  /** @internal */
  constructor(
    private readonly sock: Socket,
    private readonly d: Deadline,
    private readonly what: string,
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    try {
      for (;;) {
        const m = await this.sock.next()
        if (m === null) return
        if (m.text === undefined) continue
        let ev: T
        try {
          ev = JSON.parse(m.text) as T
        } catch {
          throw new LoamError('internal', `${this.what}: the daemon sent ${JSON.stringify(m.text)}, not an event`)
        }
        yield ev
      }
    } finally {
      this.close()
    }
  }

  /** close ends the watch. */
  close(): void {
    this.sock.close()
    this.d.done()
  }
}

/**
 * PortStream is one TCP connection to a port of a sandbox, made inside it.
 * Iterate it for the bytes the program sends; the loop ends when the
 * program closes the connection. write() sends bytes; close() closes the
 * connection (there is no half close).
 */
export class PortStream implements AsyncIterable<Uint8Array> {
  /** @internal */
  constructor(
    private readonly sock: Socket,
    private readonly d: Deadline,
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    try {
      for (;;) {
        const m = await this.sock.next()
        if (m === null) return
        if (m.binary) yield m.binary
      }
    } finally {
      this.close()
    }
  }

  /** write sends bytes (a string as UTF-8), in messages of at most 256 KiB. */
  write(data: string | Uint8Array): void {
    const b = bytes(data)
    for (let i = 0; i < b.length; i += MAX_PORT_MESSAGE) {
      if (!this.sock.send(b.subarray(i, i + MAX_PORT_MESSAGE))) throw new StreamEndedError('writing to the port: the stream is closed', 1000)
    }
  }

  /** read collects everything the program sends until it closes the connection. */
  async read(): Promise<Uint8Array> {
    const parts: Uint8Array[] = []
    for await (const p of this) parts.push(p)
    let n = 0
    for (const p of parts) n += p.length
    const out = new Uint8Array(n)
    n = 0
    for (const p of parts) {
      out.set(p, n)
      n += p.length
    }
    return out
  }

  /** close closes the connection. */
  close(): void {
    this.sock.close()
    this.d.done()
  }
}
