import { LoamError, StreamEndedError, apiError } from './errors.js'
import { AsyncQueue, Deadline, Socket, bytes } from './transport.js'
import type { ExecControl } from './types.js'

/** A piece of a command's output. With a terminal all output is 'stdout'. */
export interface OutputChunk {
  stream: 'stdout' | 'stderr'
  data: Uint8Array
}

/** Where an attach socket's replay of a stream starts (an "offset" message). */
export interface OffsetEvent {
  stream: 'stdout' | 'stderr'
  /** The offset, in the stream's output, of the byte that follows. */
  offset: number
  /** Bytes before it, from the offset asked for, no longer buffered. */
  dropped: number
}

/** What a stdin option may be: sent, then stdin is closed. */
export type StdinSource = string | Uint8Array | AsyncIterable<string | Uint8Array> | Iterable<string | Uint8Array>

const STDIN_CHUNK = 64 << 10

/**
 * Process is a running command seen through an exec or attach socket.
 * Iterate it (`for await (const chunk of proc)`) for its output; output not
 * read is kept until it is. wait() resolves with the exit code. Closing
 * (close()) hangs up a command that is not detachable (SIGHUP) and leaves a
 * detachable session running.
 */
export class Process implements AsyncIterable<OutputChunk> {
  /** The command's pid, once started. */
  pid?: number
  /** The session's id (s-…), once started. */
  sessionId?: string
  /** Resolves when the server says the command started. */
  readonly started: Promise<{ pid: number; sessionId: string }>
  private readonly output = new AsyncQueue<OutputChunk>()
  private readonly exit: Promise<number | null>
  private startedResolve!: (v: { pid: number; sessionId: string }) => void

  /** @internal */
  constructor(
    private readonly sock: Socket,
    private readonly d: Deadline,
    opts: { onOffset?: (ev: OffsetEvent) => void; noFollow?: boolean; what: string },
  ) {
    let startedReject!: (e: Error) => void
    this.started = new Promise((resolve, reject) => {
      this.startedResolve = resolve
      startedReject = reject
    })
    this.started.catch(() => undefined)
    this.exit = this.pump(opts).then(
      (code) => {
        this.output.end()
        startedReject(new StreamEndedError(`${opts.what} ended before it started`, 1000))
        d.done()
        return code
      },
      (e: Error) => {
        this.output.end(e)
        startedReject(e)
        d.done()
        sock.close()
        throw e
      },
    )
    this.exit.catch(() => undefined)
  }

  private async pump(opts: { onOffset?: (ev: OffsetEvent) => void; noFollow?: boolean; what: string }): Promise<number | null> {
    for (;;) {
      const m = await this.sock.next()
      if (m === null) {
        // A normal close without "exit": the end of a logs read, or of an
        // attach that does not follow; an exec's stream cut short otherwise.
        if (opts.noFollow) return null
        throw new StreamEndedError(`${opts.what}: the stream ended before the command exited`, 1000)
      }
      if (m.binary) {
        const b = m.binary
        if (b.length === 0 || (b[0] !== 1 && b[0] !== 2)) continue
        this.output.push({ stream: b[0] === 2 ? 'stderr' : 'stdout', data: b.subarray(1) })
        continue
      }
      let ctl: ExecControl
      try {
        ctl = JSON.parse(m.text) as ExecControl
      } catch {
        throw new LoamError('internal', `${opts.what}: the daemon sent ${JSON.stringify(m.text)}, not a control message`)
      }
      switch (ctl.type) {
        case 'started':
          this.pid = ctl.pid ?? 0
          this.sessionId = ctl.session ?? ''
          this.startedResolve({ pid: this.pid, sessionId: this.sessionId })
          break
        case 'offset':
          opts.onOffset?.({ stream: ctl.stream === 2 ? 'stderr' : 'stdout', offset: ctl.offset ?? 0, dropped: ctl.dropped ?? 0 })
          break
        case 'exit':
          if (typeof ctl.exit_code !== 'number') throw new LoamError('internal', `${opts.what}: exit without exit_code`)
          this.sock.close()
          return ctl.exit_code
        case 'error':
          this.sock.close()
          throw apiError(ctl.error?.code ?? 'internal', ctl.error?.message ?? 'the command could not be started')
      }
    }
  }

  async *[Symbol.asyncIterator](): AsyncIterator<OutputChunk> {
    for (;;) {
      const c = await this.output.next()
      if (c === null) return
      yield c
    }
  }

  /**
   * wait resolves with the exit code (128+N for a command killed by signal
   * N), after every byte of output was received; null for a logs read or an
   * attach that does not follow and ended before the command exited.
   */
  wait(): Promise<number | null> {
    return this.exit
  }

  /** write sends bytes (a string as UTF-8) to the command's stdin. */
  write(data: string | Uint8Array): void {
    const b = bytes(data)
    for (let i = 0; i < b.length; i += STDIN_CHUNK) {
      const part = b.subarray(i, i + STDIN_CHUNK)
      const msg = new Uint8Array(part.length + 1) // msg[0] is 0: stdin
      msg.set(part, 1)
      if (!this.sock.send(msg)) throw new StreamEndedError('writing stdin: the stream is closed', 1000)
    }
  }

  /** closeStdin tells the command its stdin is over (EOF). */
  closeStdin(): void {
    this.control({ type: 'eof' })
  }

  /** resize changes the size of the command's terminal. */
  resize(rows: number, cols: number): void {
    this.control({ type: 'resize', rows, cols })
  }

  /** kill sends a signal ('TERM', 'INT', 'KILL', a number…) to the command's process group. */
  kill(signal = 'TERM'): void {
    this.control({ type: 'signal', signal })
  }

  /** close closes the socket: a command that is not detachable gets SIGHUP. */
  close(): void {
    this.sock.close()
  }

  /** pipe sends src to stdin, then EOF; a failure ends the stream. */
  async pipe(src: StdinSource): Promise<void> {
    try {
      if (typeof src === 'string' || src instanceof Uint8Array) this.write(src)
      else if (Symbol.asyncIterator in src) for await (const c of src) this.write(c)
      else for (const c of src) this.write(c)
      this.closeStdin()
    } catch (e) {
      if (!this.d.signal.aborted) this.sock.close(1000)
      throw e
    }
  }

  private control(ctl: ExecControl): void {
    if (!this.sock.send(JSON.stringify(ctl))) throw new StreamEndedError(`sending ${ctl.type}: the stream is closed`, 1000)
  }
}
