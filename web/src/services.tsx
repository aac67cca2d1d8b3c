// A sandbox's services (supervised commands): their state, start, stop and
// restart, and their logs, followed live over the logs WebSocket.
import { useEffect, useRef, useState } from 'preact/hooks'
import { enc, services, socket, message, type ServiceStatus, STDERR } from './api'
import { Err, useAction, when, writes } from './ui'

export function Services ({ sandbox, running }: { sandbox: string, running: boolean }) {
  const [list, setList] = useState<ServiceStatus[] | null>(null)
  const [err, setErr] = useState('')
  const [tick, setTick] = useState(0)
  const [logs, setLogs] = useState('')
  const [run, actErr] = useAction()

  useEffect(() => {
    if (!running) return
    let live = true
    const load = async () => {
      try {
        const l = await services.list(sandbox)
        if (live) { setList(l); setErr('') }
      } catch (e) {
        if (live) setErr(message(e))
      }
    }
    void load()
    const t = setInterval(load, 3000)
    return () => { live = false; clearInterval(t) }
  }, [sandbox, running, tick])

  if (!running) return <p class="muted">The sandbox is not running: wake it to see its services.</p>
  const act = (name: string, a: 'start' | 'stop' | 'restart') => run(async () => { await services.action(sandbox, name, a); setTick(t => t + 1) })
  return (
    <div>
      <Err text={err || actErr} />
      {list !== null && list.length === 0 && <p class="muted">No services. Define them at create, with <code>loam service add</code>, or PUT …/services/NAME.</p>}
      {list !== null && list.length > 0 && (
        <table data-testid="services">
          <thead><tr><th>Service</th><th>Command</th><th>State</th><th>PID</th><th>Restarts</th><th>Started</th><th /></tr></thead>
          <tbody>
            {list.map(s => (
              <tr key={s.name} data-testid={`service-${s.name}`}>
                <td>{s.name}</td>
                <td><code>{s.cmd.join(' ')}</code></td>
                <td><span class={`state state-${s.state}`} data-testid="service-state">{s.state}</span>{s.exit_code !== null && s.state !== 'running' ? ` (exit ${s.exit_code})` : ''}{s.error ? <div class="error small">{s.error}</div> : null}</td>
                <td data-testid="service-pid">{s.pid ?? '–'}</td>
                <td>{s.restarts}</td>
                <td>{s.started_at ? when(s.started_at) : '–'}</td>
                <td class="actions">
                  <button {...writes()} onClick={() => setLogs(s.name)} data-testid={`logs-${s.name}`}>Logs</button>
                  {s.state === 'running'
                    ? <button {...writes()} onClick={() => act(s.name, 'stop')} data-testid="service-stop">Stop</button>
                    : <button {...writes()} onClick={() => act(s.name, 'start')} data-testid="service-start">Start</button>}
                  <button {...writes()} onClick={() => act(s.name, 'restart')} data-testid="service-restart">Restart</button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {logs && <Logs key={logs} sandbox={sandbox} service={logs} close={() => setLogs('')} />}
    </div>
  )
}

const decoder = () => new TextDecoder()

/** A service's logs: what is buffered, then live output, stderr marked. */
function Logs ({ sandbox, service, close }: { sandbox: string, service: string, close: () => void }) {
  const [lines, setLines] = useState<Array<{ err: boolean, text: string }>>([])
  const [status, setStatus] = useState('connecting…')
  const pre = useRef<HTMLPreElement>(null)
  useEffect(() => {
    const ws = socket(`/sandboxes/${enc(sandbox)}/services/${enc(service)}/logs`)
    const out = decoder()
    const errs = decoder()
    ws.onopen = () => setStatus('following')
    ws.onmessage = (ev) => {
      if (typeof ev.data === 'string') {
        const msg = JSON.parse(ev.data)
        if (msg.type === 'offset' && msg.dropped > 0) setLines(l => [...l, { err: true, text: `[${msg.dropped} bytes no longer buffered]\n` }])
        return
      }
      const b = new Uint8Array(ev.data as ArrayBuffer)
      const isErr = b[0] === STDERR
      const text = (isErr ? errs : out).decode(b.subarray(1), { stream: true })
      // Kept to the last 2000 chunks: a chatty service must not eat the page.
      setLines(l => [...l, { err: isErr, text }].slice(-2000))
    }
    ws.onclose = (ev) => setStatus(ev.code === 1000 ? 'ended' : `closed (${ev.code})`)
    return () => ws.close(1000)
  }, [sandbox, service])
  useEffect(() => { pre.current?.scrollTo(0, pre.current.scrollHeight) }, [lines])
  return (
    <div class="card">
      <div class="row"><strong>Logs of {service}</strong><span class="muted small">{status}</span><span class="spacer" /><button onClick={close}>Close</button></div>
      <pre class="logs" ref={pre} data-testid="service-logs">{lines.map((l, i) => <span key={i} class={l.err ? 'stderr' : ''}>{l.text}</span>)}</pre>
    </div>
  )
}
