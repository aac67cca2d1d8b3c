// A terminal in the page: xterm.js over the exec WebSocket (api/exec.go),
// with a TTY, resized with the page. The shell is a detachable session, so
// a memory checkpoint or a restore, which closes every exec socket (status
// 1011), does not end it: the terminal says so and attaches to it again,
// replaying its buffered output onto a cleared screen.
import { useEffect, useRef, useState } from 'preact/hooks'
import { Terminal } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import '@xterm/xterm/css/xterm.css'
import { enc, socket, STDIN, STDOUT, STDERR } from './api'

/** The shell: bash where the template has it, sh otherwise. */
const SHELL = ['sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l']

const encoder = new TextEncoder()

export function TerminalView ({ sandbox }: { sandbox: string }) {
  const box = useRef<HTMLDivElement>(null)
  const [status, setStatus] = useState('connecting…')

  useEffect(() => {
    const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false })
    const fit = new FitAddon()
    term.loadAddon(fit)
    term.open(box.current!)
    fit.fit()
    let ws: WebSocket | null = null
    let session = ''
    let ended = false
    let attaches = 0
    let retry: ReturnType<typeof setTimeout> | undefined

    const send = (data: string) => {
      if (ws?.readyState !== WebSocket.OPEN) return
      const bytes = encoder.encode(data)
      const frame = new Uint8Array(bytes.length + 1)
      frame[0] = STDIN
      frame.set(bytes, 1)
      ws.send(frame)
    }
    const resize = () => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', rows: term.rows, cols: term.cols }))
    }

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
          setStatus(attaches > 0 ? `session ${session}: attached again (${attaches})` : `session ${session} (pid ${msg.pid})`)
          term.focus()
        } else if (msg.type === 'exit') {
          ended = true
          setStatus(`the shell exited (code ${msg.exit_code})`)
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
        attaches++
        setStatus(`session ${session}: attached again (${attaches})`)
        onopen?.call(s, ev)
      }
      const onclose = s.onclose
      s.onclose = (ev) => {
        if (!opened && ws === s && !ended) {
          // Refused while the sandbox is still busy: try again.
          setStatus(`attaching to session ${session} again… (${ev.code})`)
          retry = setTimeout(reattach, 1000)
          return
        }
        onclose?.call(s, ev)
      }
    }

    wire(socket(`/sandboxes/${enc(sandbox)}/exec`), JSON.stringify({
      cmd: SHELL, tty: true, stdin: true, detachable: true, rows: term.rows, cols: term.cols,
    }))
    const input = term.onData(send)
    const resized = term.onResize(resize)
    const observer = new ResizeObserver(() => fit.fit())
    observer.observe(box.current!)
    return () => {
      ended = true
      clearTimeout(retry)
      observer.disconnect()
      input.dispose()
      resized.dispose()
      // Leaving the page hangs the shell up, as closing a terminal
      // window does; a detachable session would otherwise run on.
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'signal', signal: 'HUP' }))
      ws?.close(1000)
      term.dispose()
    }
  }, [sandbox])

  return (
    <div class="terminal">
      <div class="terminal-status" data-testid="terminal-status">{status}</div>
      <div class="terminal-box" ref={box} data-testid="terminal" />
    </div>
  )
}
