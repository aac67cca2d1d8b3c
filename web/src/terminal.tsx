// A terminal in the page: xterm.js over the exec WebSocket (api/exec.go),
// with a TTY, resized with the page. The shell is a detachable session, so
// a memory checkpoint or a restore, which closes every exec socket (status
// 1011), does not end it: the terminal says so and attaches to it again,
// replaying its buffered output onto a cleared screen. The terminal can
// also attach to a detachable session started elsewhere (loam run -d, the
// SDKs), which it then leaves running when it closes.
import { useEffect, useRef, useState } from 'preact/hooks'
import { Terminal } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import '@xterm/xterm/css/xterm.css'
import { call, enc, socket, message, STDIN, STDOUT, STDERR } from './api'
import type { Session } from '../../sdk/ts/src/types'

/** The shell: bash where the template has it, sh otherwise. */
const SHELL = ['sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l']

const encoder = new TextEncoder()
// GIVE_UP_MS is how long the terminal tries to attach again to a daemon
// that went away.
const GIVE_UP_MS = 5 * 60_000

/**
 * The terminal tab: a terminal on a new shell, or on a detachable session
 * picked from those running in the sandbox.
 */
export function Terminals ({ sandbox }: { sandbox: string }) {
  const [target, setTarget] = useState<{ attach?: string, n: number }>({ n: 0 })
  const [list, setList] = useState<Session[] | null>(null)
  const [err, setErr] = useState('')
  const load = async () => {
    try {
      const l = (await call<{ sessions: Session[] }>('GET', `/sandboxes/${enc(sandbox)}/sessions`)).sessions
      setList(l.filter(s => s.detachable && s.state === 'running'))
      setErr('')
    } catch (e) {
      setErr(message(e))
    }
  }
  return (
    <div>
      <div class="row wrap">
        <button data-testid="new-shell" onClick={() => setTarget({ n: target.n + 1 })}>New shell</button>
        <button data-testid="list-sessions" onClick={load}>Detachable sessions…</button>
        {list !== null && list.length === 0 && <span class="muted small">none running</span>}
        {(list ?? []).map(s => (
          <button key={s.id} class="label" title={s.cmd.join(' ')} data-testid={`attach-${s.id}`}
            onClick={() => setTarget({ attach: s.id, n: target.n + 1 })}>
            {s.id}: {s.cmd.join('\0') === SHELL.join('\0') ? 'a console shell' : s.cmd.join(' ').slice(0, 40)}
          </button>
        ))}
        {err && <span class="error small">{err}</span>}
      </div>
      <TerminalView key={target.n} sandbox={sandbox} attach={target.attach} />
    </div>
  )
}

export function TerminalView ({ sandbox, attach }: { sandbox: string, attach?: string }) {
  const box = useRef<HTMLDivElement>(null)
  const [status, setStatus] = useState('connecting…')
  const [size, setSize] = useState('')

  useEffect(() => {
    const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000 })
    const fit = new FitAddon()
    term.loadAddon(fit)
    term.open(box.current!)
    fit.fit()
    setSize(`${term.rows} ${term.cols}`)
    let ws: WebSocket | null = null
    let session = attach ?? ''
    let ended = false
    let attaches = 0
    let retry: ReturnType<typeof setTimeout> | undefined
    // lost is when the daemon went away, 0 while it answers.
    let lost = 0

    const send = (data: string) => {
      if (ws?.readyState !== WebSocket.OPEN) return
      const bytes = encoder.encode(data)
      const frame = new Uint8Array(bytes.length + 1)
      frame[0] = STDIN
      frame.set(bytes, 1)
      ws.send(frame)
    }
    const resize = () => {
      setSize(`${term.rows} ${term.cols}`)
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows: term.rows, cols: term.cols }))
    }
    const attachedStatus = () => `session ${session}: ${attach ? 'attached' : 'attached again'} (${attaches})`

    // wire hooks a socket (exec or attach) to the terminal.
    const wire = (s: WebSocket, first?: string) => {
      ws = s
      s.onopen = () => {
        if (first) s.send(first)
        else resize()
      }
      s.onmessage = (ev) => {
        if (typeof ev.data !== 'string') {
          const b = new Uint8Array(ev.data as ArrayBuffer)
          if (b[0] === STDOUT || b[0] === STDERR) term.write(b.subarray(1))
          return
        }
        const msg = JSON.parse(ev.data)
        if (msg.type === 'started') {
          session = msg.session
          setStatus(attaches > 0 ? attachedStatus() : `session ${session} (pid ${msg.pid})`)
          term.focus()
        } else if (msg.type === 'exit') {
          ended = true
          setStatus(`session ${session} exited (code ${msg.exit_code})`)
        } else if (msg.type === 'error') {
          ended = true
          setStatus(`could not start the shell: ${msg.error?.message}`)
        }
      }
      s.onclose = (ev) => {
        if (ws !== s || ended) return
        if (ev.code === 1011 && session !== '') {
          // A memory checkpoint or a restore cut the socket; the session
          // runs on (or was put back), and can be attached again.
          setStatus(`the socket was closed by a checkpoint or restore; session ${session} runs on: attaching again…`)
          retry = setTimeout(reattach, 500)
          return
        }
        if ((ev.code === 1001 || ev.code === 1006) && session !== '') {
          // The daemon went away (a restart, an upgrade) or the network
          // dropped: the session runs on in the sandbox, whose agent owns
          // it. Attach again once the daemon answers.
          setStatus(`lost the daemon (${ev.code}); session ${session} runs on in the sandbox: attaching again…`)
          lost = Date.now()
          retry = setTimeout(reattach, 1000)
          return
        }
        setStatus(`disconnected (${ev.code}${ev.reason ? ': ' + ev.reason : ''})`)
      }
    }
    const reattach = () => {
      // The whole buffer is replayed onto a cleared screen: after a
      // restore the session's output is the checkpoint's, not what this
      // page saw last.
      term.reset()
      const s = socket(`/sandboxes/${enc(sandbox)}/sessions/${enc(session)}/attach`)
      let opened = false
      wire(s)
      const onopen = s.onopen
      s.onopen = (ev) => {
        opened = true
        lost = 0
        attaches++
        setStatus(attachedStatus())
        onopen?.call(s, ev)
      }
      const onclose = s.onclose
      s.onclose = (ev) => {
        if (!opened && ws === s && !ended) {
          if (attaches === 0 && attach && lost === 0) {
            setStatus(`could not attach to session ${session} (${ev.code}): it may have ended`)
            return
          }
          if (lost > 0 && Date.now() - lost > GIVE_UP_MS) {
            setStatus(`the daemon has not answered for ${GIVE_UP_MS / 60000} minutes (${ev.code}): reload the page to try again`)
            return
          }
          // Refused while the sandbox is still busy: try again.
          setStatus(`attaching to session ${session} again… (${ev.code})`)
          retry = setTimeout(reattach, 1000)
          return
        }
        onclose?.call(s, ev)
      }
    }

    if (attach) {
      reattach()
    } else {
      wire(socket(`/sandboxes/${enc(sandbox)}/exec`), JSON.stringify({
        cmd: SHELL, tty: true, stdin: true, detachable: true, rows: term.rows, cols: term.cols,
      }))
    }
    const input = term.onData(send)
    const resized = term.onResize(resize)
    const observer = new ResizeObserver(() => fit.fit())
    observer.observe(box.current!)
    // Leaving a shell of its own hangs it up, as closing a terminal
    // window does (a detachable session would otherwise run on), on a
    // reload or a closed tab too; a session it attached to runs on.
    const hangUp = () => {
      if (!attach && ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'signal', signal: 'HUP' }))
    }
    addEventListener('pagehide', hangUp)
    return () => {
      ended = true
      clearTimeout(retry)
      removeEventListener('pagehide', hangUp)
      observer.disconnect()
      input.dispose()
      resized.dispose()
      hangUp()
      ws?.close(1000)
      term.dispose()
    }
  }, [sandbox, attach])

  return (
    <div class="terminal">
      <div class="terminal-status" data-testid="terminal-status">{status}</div>
      <div class="terminal-box" ref={box} data-testid="terminal" data-size={size} />
    </div>
  )
}
