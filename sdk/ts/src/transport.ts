import {
  LoamError,
  StreamEndedError,
  StreamInterruptedError,
  errorFromBody,
  errorFromResponse,
} from './errors.js'
import { WEBSOCKET_PROTOCOL, WEBSOCKET_TOKEN_PREFIX } from './types.js'

/** Options every call takes. */
export interface CallOptions {
  /** Aborts the call (and closes its stream); the call rejects with the signal's reason. */
  signal?: AbortSignal
  /** Milliseconds before the call is aborted with a TimeoutError; none when 0 or left out. */
  timeout?: number
}

/** Where the API is and how to authenticate, resolved once. */
export interface Endpoint {
  url: string
  token: string
  /** How WebSockets carry the token; by platform when left out. */
  webSocketAuth?: 'header' | 'subprotocol'
}

/** A query: values that are undefined are left out; arrays repeat the key. */
export type Query = Record<string, string | number | boolean | string[] | undefined>

/**
 * Deadline combines a call's signal and timeout into one signal, and is
 * released (its timer cleared) when the call is done.
 */
export class Deadline {
  readonly signal: AbortSignal
  private readonly ctl = new AbortController()
  private timer?: ReturnType<typeof setTimeout>
  private readonly parent?: AbortSignal
  private readonly onAbort = (): void => this.ctl.abort(this.parent?.reason)

  constructor(opts: CallOptions = {}) {
    this.signal = this.ctl.signal
    this.parent = opts.signal
    if (opts.signal?.aborted) this.ctl.abort(opts.signal.reason)
    else opts.signal?.addEventListener('abort', this.onAbort, { once: true })
    if (opts.timeout && opts.timeout > 0 && !this.signal.aborted) {
      this.timer = setTimeout(() => {
        this.ctl.abort(new DOMException(`the call took longer than its timeout of ${opts.timeout} ms`, 'TimeoutError'))
      }, opts.timeout)
    }
  }

  /** throwIfAborted throws the reason the call was aborted, if it was. */
  throwIfAborted(): void {
    if (this.signal.aborted) throw this.signal.reason
  }

  /** done releases the timer and the listener on the caller's signal. */
  done(): void {
    if (this.timer !== undefined) clearTimeout(this.timer)
    this.parent?.removeEventListener('abort', this.onAbort)
  }
}

function queryString(q?: Query): string {
  if (!q) return ''
  const p = new URLSearchParams()
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined) continue
    if (Array.isArray(v)) for (const x of v) p.append(k, x)
    else p.append(k, String(v))
  }
  const s = p.toString()
  return s ? '?' + s : ''
}

/** seg escapes one path segment, refusing an empty one. */
export function seg(what: string, ref: string): string {
  if (!ref) throw new LoamError('invalid', `no ${what} given`)
  return encodeURIComponent(ref)
}

/** Transport sends the API's requests: HTTP through fetch, WebSockets through the platform's WebSocket or ws. */
export class Transport {
  constructor(private readonly endpoint: () => Promise<Endpoint>) {}

  /**
   * fetch sends a request and returns the answer when it is a success;
   * an error answer rejects with its LoamError. The deadline stays armed
   * for the caller to read the body under.
   */
  async fetch(
    method: string,
    path: string,
    d: Deadline,
    init: { query?: Query; json?: unknown; body?: BodyInit | Uint8Array | ReadableStream<Uint8Array>; contentType?: string } = {},
  ): Promise<Response> {
    d.throwIfAborted()
    const ep = await this.endpoint()
    const headers: Record<string, string> = { Authorization: `Bearer ${ep.token}`, Accept: 'application/json' }
    let body = init.body as BodyInit | undefined
    if (init.json !== undefined) {
      body = JSON.stringify(init.json)
      headers['Content-Type'] = 'application/json'
    } else if (body !== undefined) {
      headers['Content-Type'] = init.contentType ?? 'application/octet-stream'
    }
    const req: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: d.signal }
    if (body instanceof ReadableStream) req.duplex = 'half'
    let resp: Response
    try {
      resp = await fetch(ep.url + path + queryString(init.query), req)
    } catch (e) {
      if (d.signal.aborted) throw d.signal.reason
      throw new LoamError('unavailable', `reaching loam at ${ep.url}: ${(e as Error).message}`)
    }
    if (!resp.ok) throw await errorFromResponse(resp)
    return resp
  }

  /** json sends a request and decodes its JSON answer (undefined for 204). */
  async json<T>(method: string, path: string, opts: CallOptions & { query?: Query; body?: unknown } = {}): Promise<T> {
    const d = new Deadline(opts)
    try {
      const resp = await this.fetch(method, path, d, { query: opts.query, json: opts.body })
      if (resp.status === 204) return undefined as T
      try {
        return (await resp.json()) as T
      } catch (e) {
        if (d.signal.aborted) throw d.signal.reason
        throw new LoamError('internal', `decoding the answer to ${method} ${path}: ${(e as Error).message}`)
      }
    } finally {
      d.done()
    }
  }

  /**
   * socket opens a WebSocket to path. On Node it sends the token in the
   * Authorization header; in a browser, which cannot set headers on a
   * WebSocket, as the subprotocol loam.token.<token>, next to loam.v1.
   */
  async socket(path: string, d: Deadline, query?: Query): Promise<Socket> {
    d.throwIfAborted()
    const ep = await this.endpoint()
    const url = ep.url.replace(/^http/, 'ws') + path + queryString(query)
    const native = (globalThis as { WebSocket?: typeof WebSocket }).WebSocket
    const isNode = typeof (globalThis as { process?: { versions?: { node?: string } } }).process?.versions?.node === 'string'
    // On Node, ws (which can send headers); the platform's WebSocket, which
    // cannot, elsewhere and when ws is missing.
    const Ctor = isNode || !native ? await loadNodeWS() : undefined
    const headers = Ctor !== undefined && Ctor !== native
    const auth = ep.webSocketAuth ?? (headers ? 'header' : 'subprotocol')
    if (auth === 'header' && !headers) throw new LoamError('invalid', "this platform's WebSocket cannot send headers: use webSocketAuth 'subprotocol'")
    return open(Ctor ?? (native as unknown as WSCtor), url, ep, auth, d, () => this.fetch('GET', path, d, { query }).then(() => undefined))
  }
}

/** A message of a socket: text or binary. */
export type Message = { text: string; binary?: undefined } | { binary: Uint8Array; text?: undefined }

/** The part of a WebSocket both the platform's and ws's have. */
interface WS {
  binaryType: string
  readonly readyState: number
  send(data: string | Uint8Array): void
  close(code?: number, reason?: string): void
  onopen: ((ev: unknown) => void) | null
  onmessage: ((ev: { data: unknown }) => void) | null
  onclose: ((ev: { code: number; reason: string }) => void) | null
  onerror: ((ev: unknown) => void) | null
}

type WSCtor = new (url: string, protocols?: string | string[], opts?: object) => WS

let nodeWS: Promise<WSCtor> | undefined

async function loadNodeWS(): Promise<WSCtor> {
  const native = (globalThis as { WebSocket?: unknown }).WebSocket
  // A variable, so that bundlers for browsers leave ws out.
  const name = 'ws'
  nodeWS ??= import(name)
    .then((m: { default?: unknown; WebSocket?: unknown }) => (m.default ?? m.WebSocket) as WSCtor)
    .catch((e: Error) => {
      if (native) return native as WSCtor
      throw new LoamError('unavailable', `no WebSocket: install the ws package (${e.message})`)
    })
  return nodeWS
}

async function open(
  Ctor: WSCtor,
  url: string,
  ep: Endpoint,
  auth: 'header' | 'subprotocol',
  d: Deadline,
  probe: () => Promise<void>,
): Promise<Socket> {
  const protocols = auth === 'header' ? [WEBSOCKET_PROTOCOL] : [WEBSOCKET_PROTOCOL, WEBSOCKET_TOKEN_PREFIX + ep.token]
  // Options are ws's; a browser's WebSocket takes two arguments only.
  const ws = new Ctor(url, protocols, {
    headers: auth === 'header' ? { Authorization: `Bearer ${ep.token}` } : {},
    maxPayload: 256 << 20,
    perMessageDeflate: false,
  })
  const on = (ws as unknown as { on?: (ev: string, f: (...a: never[]) => void) => void }).on
  try {
    return await handshake(ws, d, (reject) => {
      // ws tells the HTTP answer of a refused handshake: the API's error.
      on?.call(ws, 'unexpected-response', (req: { destroy(): void }, res: AsyncIterable<Uint8Array> & { statusCode: number }) => {
        void (async () => {
          const chunks: Uint8Array[] = []
          try {
            for await (const c of res) chunks.push(c)
          } catch {
            // a partial body still has the status
          }
          reject(errorFromBody(res.statusCode, new TextDecoder().decode(concat(chunks))))
          req.destroy()
        })()
      })
    })
  } catch (e) {
    if (on || !(e instanceof StreamEndedError)) throw e
    // A browser does not say why a handshake failed: ask again over HTTP,
    // where the API answers with its error (426 when all is well but the upgrade).
    await probe().catch((pe: unknown) => {
      if (pe instanceof LoamError && pe.code !== 'upgrade_required') throw pe
    })
    throw e
  }
}

function handshake(ws: WS, d: Deadline, hook: (reject: (e: Error) => void) => void): Promise<Socket> {
  ws.binaryType = 'arraybuffer'
  return new Promise<Socket>((resolve, reject) => {
    let settled = false
    const fail = (e: Error): void => {
      if (settled) return
      settled = true
      d.signal.removeEventListener('abort', onAbort)
      try {
        ws.close()
      } catch {
        // not open yet
      }
      reject(e)
    }
    const onAbort = (): void => fail(d.signal.reason as Error)
    d.signal.addEventListener('abort', onAbort, { once: true })
    hook(fail)
    ws.onerror = () => undefined
    ws.onclose = (ev) => fail(new StreamEndedError(`the WebSocket handshake failed (close ${ev.code})`, ev.code))
    const sock = new Socket(ws, d)
    ws.onopen = () => {
      if (settled) return
      settled = true
      d.signal.removeEventListener('abort', onAbort)
      sock.listen()
      resolve(sock)
    }
  })
}

/**
 * Socket is an open WebSocket read as a queue of messages. next() gives
 * the next message, null once the server closed with status 1000, and
 * rejects with StreamInterruptedError on 1011 (a checkpoint or restore),
 * StreamEndedError on any other ending, or the abort reason.
 */
export class Socket {
  private readonly queue = new AsyncQueue<Message>()
  private readonly onAbort = (): void => {
    this.queue.end(this.d.signal.reason as Error)
    this.close(1000)
  }

  constructor(
    private readonly ws: WS,
    private readonly d: Deadline,
  ) {}

  /** listen starts queueing messages; called once the socket is open. */
  listen(): void {
    this.ws.onmessage = (ev) => {
      const data = ev.data
      if (typeof data === 'string') this.queue.push({ text: data })
      else if (data instanceof ArrayBuffer) this.queue.push({ binary: new Uint8Array(data) })
      else if (ArrayBuffer.isView(data)) this.queue.push({ binary: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) })
    }
    this.ws.onclose = (ev) => {
      this.d.signal.removeEventListener('abort', this.onAbort)
      if (ev.code === 1000) this.queue.end()
      else if (ev.code === 1011)
        this.queue.end(new StreamInterruptedError(ev.reason || 'the sandbox was checkpointed or restored'))
      else this.queue.end(new StreamEndedError(`the stream ended (close ${ev.code}${ev.reason ? ': ' + ev.reason : ''})`, ev.code))
    }
    if (this.d.signal.aborted) this.onAbort()
    else this.d.signal.addEventListener('abort', this.onAbort, { once: true })
  }

  /** next is the next message, or null when the stream ended normally. */
  next(): Promise<Message | null> {
    return this.queue.next()
  }

  /** send sends a text or binary message; false when the socket is no longer open. */
  send(data: string | Uint8Array): boolean {
    if (this.ws.readyState !== 1) return false
    this.ws.send(data)
    return true
  }

  /** close closes the socket (status 1000 unless given). */
  close(code = 1000, reason = ''): void {
    try {
      if (this.ws.readyState <= 1) this.ws.close(code, reason)
    } catch {
      // closing twice is no error
    }
  }
}

/** AsyncQueue is an unbounded queue with one reader, which waits for items. */
export class AsyncQueue<T> {
  private items: T[] = []
  private waiting?: { resolve: (v: T | null) => void; reject: (e: Error) => void }
  private ended = false
  private error?: Error

  push(v: T): void {
    if (this.ended) return
    if (this.waiting) {
      const w = this.waiting
      this.waiting = undefined
      w.resolve(v)
    } else this.items.push(v)
  }

  /** end ends the queue once its items are read: with err, reads then reject. */
  end(err?: Error): void {
    if (this.ended) return
    this.ended = true
    this.error = err
    if (this.waiting) {
      const w = this.waiting
      this.waiting = undefined
      if (err) w.reject(err)
      else w.resolve(null)
    }
  }

  next(): Promise<T | null> {
    if (this.items.length > 0) return Promise.resolve(this.items.shift() as T)
    if (this.ended) return this.error ? Promise.reject(this.error) : Promise.resolve(null)
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject }
    })
  }
}

/** concat joins byte arrays. */
export function concat(parts: Uint8Array[]): Uint8Array {
  let n = 0
  for (const p of parts) n += p.length
  const out = new Uint8Array(n)
  let i = 0
  for (const p of parts) {
    out.set(p, i)
    i += p.length
  }
  return out
}

/** bytes is a string as UTF-8, or the bytes as they are. */
export function bytes(data: string | Uint8Array): Uint8Array {
  return typeof data === 'string' ? new TextEncoder().encode(data) : data
}

