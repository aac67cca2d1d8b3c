// The audit log (#/audit): who changed what in the org, newest first, over
// a window of time, filtered by action. An org admin's key sees its org;
// the daemon's admin token (the operator) sees every org.
import { useEffect, useState } from 'preact/hooks'
import { audit, message } from './api'
import type { AuditEvent } from './api'
import { Err, ago, sandboxHref, when } from './ui'

/** The windows the view offers, as the API's since takes them. */
const windows = [['1h', 'last hour'], ['24h', 'last 24 hours'], ['168h', 'last 7 days'], ['720h', 'last 30 days']]

/** How many events the view shows at most. */
const SHOW = 500

/** The target as a link to its sandbox's page when it names one. */
function Target ({ target }: { target: string }) {
  const m = /^sandboxes\/([^/]+)(.*)$/.exec(target)
  if (!m) return <span class="mono">{target}</span>
  return <span class="mono"><a href={sandboxHref(decodeURIComponent(m[1]))}>sandboxes/{m[1]}</a>{m[2]}</span>
}

export function AuditLog () {
  const [since, setSince] = useState('24h')
  const [action, setAction] = useState('')
  const [shown, setShown] = useState<{ events: AuditEvent[], total: number, cut: boolean } | null>(null)
  const [err, setErr] = useState('')
  const [actions, setActions] = useState<string[]>([])
  const [tick, setTick] = useState(0)
  useEffect(() => {
    let live = true
    setErr('')
    audit.list(since, action.trim(), SHOW).then(r => {
      if (!live) return
      setShown(r)
      // The filter offers the actions seen, across views.
      setActions(a => [...new Set([...a, ...r.events.map(e => e.action)])].sort())
    }, e => { if (live) setErr(message(e)) })
    return () => { live = false }
  }, [since, action, tick])
  return (
    <div data-testid="audit-page">
      <div class="toolbar">
        <h2>Audit log</h2>
        <select data-testid="audit-since" value={since} onChange={e => setSince(e.currentTarget.value)}>
          {windows.map(([v, text]) => <option key={v} value={v}>{text}</option>)}
        </select>
        <input class="filter" data-testid="audit-action" list="audit-actions" placeholder="action (sandbox.create, exec.start…)"
          value={action} onChange={e => setAction(e.currentTarget.value)} />
        <datalist id="audit-actions">{actions.map(a => <option key={a} value={a} />)}</datalist>
        <button data-testid="audit-refresh" onClick={() => setTick(t => t + 1)}>Refresh</button>
        <span class="spacer" />
        {shown && <span class="muted small" data-testid="audit-count">{
          shown.cut
            ? `more than ${shown.total} events: the newest ${shown.events.length} shown; choose a shorter window or an action`
            : shown.total > shown.events.length
              ? `${shown.total} events, the newest ${shown.events.length} shown`
              : `${shown.total} event${shown.total === 1 ? '' : 's'}`
        }</span>}
      </div>
      <Err text={err} />
      {shown && (shown.events.length === 0
        ? <p class="muted" data-testid="audit-empty">No changes recorded in this window{action.trim() !== '' ? ` of action ${action.trim()}` : ''}.</p>
        : (
          <table data-testid="audit-table">
            <thead><tr><th>Time</th><th>Org</th><th>Key</th><th>Action</th><th>Target</th><th>Outcome</th><th>Client</th></tr></thead>
            <tbody>
              {shown.events.map(ev => (
                <tr key={ev.seq} data-testid={`audit-${ev.seq}`} data-action={ev.action}>
                  <td title={when(ev.time)}>{ago(ev.time)}</td>
                  <td>{ev.org}</td>
                  <td class="mono">{ev.key}</td>
                  <td class="mono">{ev.action}</td>
                  <td><Target target={ev.target} /></td>
                  <td><span class={`state ${ev.outcome === 'ok' ? 'state-running' : 'state-error'}`}>{ev.outcome}</span></td>
                  <td class="mono small">{ev.client}</td>
                </tr>
              ))}
            </tbody>
          </table>
          ))}
    </div>
  )
}
