// The list of sandboxes, refreshed every two seconds, filtered by labels,
// with create, sleep, wake and delete.
import { useEffect, useState } from 'preact/hooks'
import { canWrite, readOnly, sandboxes, message, type Sandbox, type Template, type CreateSandbox } from './api'
import { Err, bytes, idleText, pairs, sandboxHref, useAction, useConfirm, ago, writes } from './ui'

/** How often the list is read again. */
export const REFRESH_MS = 2000

export function SandboxList () {
  const [filter, setFilterNow] = useState(sessionStorage.getItem('loam.filter') ?? '')
  // What is typed is kept apart from the filter in use, which changes on
  // Enter or blur: half a label ("team=") is no filter to ask for yet.
  const [draft, setDraft] = useState(filter)
  const setFilter = (f: string) => { setDraft(f); setFilterNow(f) }
  const [list, setList] = useState<Sandbox[] | null>(null)
  // The previous reading of each sandbox's CPU time: two readings give
  // its CPU use in cores.
  const [cpu, setCPU] = useState<Record<string, Reading>>({})
  const [err, setErr] = useState('')
  const [tick, setTick] = useState(0)
  const [creating, setCreating] = useState(false)
  const [ask, dialog] = useConfirm()
  const [act, actErr] = useAction()
  const labels = filter.split(',').map(s => s.trim()).filter(Boolean)

  useEffect(() => {
    sessionStorage.setItem('loam.filter', filter)
    let live = true
    const load = async () => {
      try {
        const l = await sandboxes.list(labels)
        if (live) { setList(l); setErr(''); setCPU(prev => readCPU(prev, l)) }
      } catch (e) {
        if (live) setErr(message(e))
      }
    }
    void load()
    const t = setInterval(load, REFRESH_MS)
    return () => { live = false; clearInterval(t) }
  }, [filter, tick])
  const refresh = () => setTick(t => t + 1)

  return (
    <section>
      <div class="toolbar">
        <h2>Sandboxes</h2>
        <input class="filter" data-testid="filter" placeholder="filter by label: team=web, env=dev"
          value={draft} onInput={e => setDraft(e.currentTarget.value)} onChange={e => setFilter(e.currentTarget.value)} />
        <button class="primary" data-testid="new-sandbox" {...writes()} onClick={() => setCreating(!creating)}>New sandbox</button>
      </div>
      {creating && <CreateForm done={(sb) => { setCreating(false); refresh(); if (sb) location.hash = sandboxHref(sb.name) }} />}
      <Err text={err || actErr} />
      {list === null
        ? <p class="muted">Loading…</p>
        : list.length === 0
          ? <p class="muted">{labels.length > 0 ? 'No sandbox has these labels.' : 'No sandboxes yet.'}</p>
          : (
            <table class="sandboxes" data-testid="sandboxes">
              <thead><tr><th>Name</th><th>State</th><th>Template or image</th><th>Labels</th><th>CPU / memory in use</th><th>Disk used</th><th>Idle</th><th>URL</th><th>Created</th><th /></tr></thead>
              <tbody>
                {list.map(sb => (
                  <tr key={sb.id} data-testid={`row-${sb.name}`}>
                    <td><a href={sandboxHref(sb.name)}>{sb.name}</a>{sb.from && <div class="muted small">fork of <a href={sandboxHref(sb.from.sandbox)}>{sb.from.sandbox}</a> @ {sb.from.checkpoint}</div>}</td>
                    <td><State sb={sb} /></td>
                    <td>{sb.image ?? sb.template}</td>
                    <td><Labels labels={sb.labels} onPick={l => setFilter(l)} /></td>
                    <td data-testid="usage"><Usage sb={sb} reading={cpu[sb.id]} /></td>
                    <td>{sb.disk?.used_bytes !== undefined ? bytes(sb.disk.used_bytes) : '–'}{sb.disk ? ` of ${sb.disk.limit_mib} MiB` : ''}</td>
                    <td>{idleText(sb.idle)}</td>
                    <td><OpenURL sb={sb} /></td>
                    <td title={sb.created_at}>{ago(sb.created_at)}</td>
                    <td class="actions">
                      <Lifecycle sb={sb} act={act} ask={ask} after={refresh} />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
            )}
      {dialog}
    </section>
  )
}

export function State ({ sb }: { sb: Sandbox }) {
  return <span class={`state state-${sb.state}`} data-testid="state" title={sb.reason}>{sb.state}{sb.reason ? ' ⚠' : ''}</span>
}

export function Labels ({ labels, onPick }: { labels: Record<string, string> | null, onPick?: (l: string) => void }) {
  const entries = Object.entries(labels ?? {})
  if (entries.length === 0) return <span class="muted">–</span>
  return <>{entries.map(([k, v]) => <button class="label" key={k} title="filter by this label" onClick={() => onPick?.(`${k}=${v}`)}>{k}={v}</button>)}</>
}

/** Opens the sandbox's URL in a new tab; a private one with its access token, which the front door trades for a cookie. */
export function OpenURL ({ sb }: { sb: Sandbox }) {
  const [err, setErr] = useState('')
  if (!sb.url) return <span class="muted">–</span>
  // A read key may not take a private sandbox's access token.
  if (!sb.public && !canWrite()) return <span class="muted" title={readOnly} data-testid="open-url">{sb.url}</span>
  return (
    <>
      <a href={sb.url} target="_blank" rel="noopener noreferrer" data-testid="open-url" onClick={async (e) => {
        if (sb.public) return
        e.preventDefault()
        // Opened first, filled after the call: a window opened after an
        // await is a pop-up to the browser.
        const w = window.open('', '_blank')
        try {
          const t = await sandboxes.accessURL(sb.name)
          const u = new URL(t.url)
          u.searchParams.set('loam_token', t.access_token)
          if (w) { w.opener = null; w.location.href = u.toString() }
        } catch (e) {
          w?.close()
          setErr(message(e))
        }
      }}>{sb.url.replace(/^https?:\/\//, '')}</a>
      {err && <span class="error small">{err}</span>}
    </>
  )
}

/** Sleep, wake and delete buttons for a sandbox in the state it is in. */
export function Lifecycle ({ sb, act, ask, after, deleted }: {
  sb: Sandbox
  deleted?: () => void
  act: (f: () => Promise<unknown>) => Promise<void>
  ask: (text: string, action: string, run: () => Promise<unknown>) => void
  after: () => void
}) {
  return (
    <>
      {sb.state === 'running' && <button data-testid="sleep" {...writes()} onClick={() => act(async () => { await sandboxes.sleep(sb.name); after() })}>Sleep</button>}
      {(sb.state === 'sleeping' || sb.state === 'stopped' || sb.state === 'error') && <button data-testid="wake" {...writes()} onClick={() => act(async () => { await sandboxes.wake(sb.name); after() })}>Wake</button>}
      <button class="danger" data-testid="delete" {...writes()} onClick={() => ask(`Delete sandbox ${sb.name}, its disk and all its checkpoints? This cannot be undone.`, 'Delete', async () => {
        await sandboxes.remove(sb.name)
        ;(deleted ?? after)()
      })}>Delete</button>
    </>
  )
}

/** The create form: every field of a create, sent as it is, so that the API's validation speaks. */
function CreateForm ({ done }: { done: (sb?: Sandbox) => void }) {
  const [templates, setTemplates] = useState<Template[]>([])
  const [f, setF] = useState({
    name: '', source: 'template', template: '', image: '', cpus: '', memory: '', disk: '', env: '', labels: '',
    idle: '', port: '', public: false, egress: '', allow: '', deny: '', secrets: '', secretFiles: '', services: '',
  })
  const [run, err, busy] = useAction()
  useEffect(() => { void sandboxes.templates().then(setTemplates).catch(() => {}) }, [])
  const set = (k: keyof typeof f) => (e: Event) => {
    const t = e.currentTarget as HTMLInputElement
    setF({ ...f, [k]: t.type === 'checkbox' ? t.checked : t.value })
  }
  const submit = (e: Event) => {
    e.preventDefault()
    void run(async () => {
      const req: CreateSandbox = {}
      if (f.name) req.name = f.name
      if (f.source === 'template' && f.template) req.template = f.template
      if (f.source === 'image' && f.image) req.image = f.image
      // What is not a number is sent as typed, so that the API's own
      // message says what the field must be.
      const num = (s: string): number | undefined => {
        if (s.trim() === '') return undefined
        const n = Number(s)
        return (Number.isFinite(n) ? n : s) as number
      }
      const res = { cpus: num(f.cpus), memory_mib: num(f.memory), disk_mib: num(f.disk) }
      if (res.cpus !== undefined || res.memory_mib !== undefined || res.disk_mib !== undefined) req.resources = res
      req.env = pairs(f.env, 'env')
      req.labels = pairs(f.labels, 'labels')
      if (f.idle) req.idle = f.idle
      const port = num(f.port)
      if (port !== undefined) req.http_port = port
      if (f.public) req.public = true
      const list = (text: string) => text.split(/[,\s]+/).filter(Boolean)
      if (f.egress || f.allow.trim() || f.deny.trim()) {
        req.network = { egress: f.egress as 'all' | 'none' | '', allow: list(f.allow), deny: list(f.deny) }
      }
      req.secrets = pairs(f.secrets, 'secrets')
      req.secret_files = pairs(f.secretFiles, 'secret files')
      // A service a line, "name=command line", run by sh -c so that a
      // line may use the shell's syntax.
      const svcs = pairs(f.services, 'services')
      if (svcs) req.services = Object.entries(svcs).map(([name, cmd]) => ({ name, cmd: ['sh', '-c', cmd] }))
      done(await sandboxes.create(req))
    })
  }
  return (
    <form class="card create" onSubmit={submit} data-testid="create-form">
      <h3>New sandbox</h3>
      <div class="grid">
        <label>Name<input data-testid="create-name" value={f.name} onInput={set('name')} placeholder="made up when empty" /></label>
        <label>From
          <select value={f.source} onChange={set('source')}><option value="template">a template</option><option value="image">an OCI image</option></select>
        </label>
        {f.source === 'template'
          ? <label>Template<select data-testid="create-template" value={f.template} onChange={set('template')}>
              <option value="">the daemon's default</option>
              {templates.map(t => <option key={t.name} value={t.name}>{t.name}</option>)}
            </select></label>
          : <label>Image<input value={f.image} onInput={set('image')} placeholder="docker.io/library/python:3.12" /></label>}
        <label>CPUs<input data-testid="create-cpus" value={f.cpus} onInput={set('cpus')} placeholder="1" inputMode="decimal" /></label>
        <label>Memory (MiB)<input value={f.memory} onInput={set('memory')} placeholder="512" inputMode="numeric" /></label>
        <label>Disk (MiB)<input value={f.disk} onInput={set('disk')} placeholder="4096" inputMode="numeric" /></label>
        <label>Idle before sleep<input value={f.idle} onInput={set('idle')} placeholder="10m; 0 never" /></label>
        <label>HTTP port<input value={f.port} onInput={set('port')} placeholder="8080" inputMode="numeric" /></label>
        <label>Egress<select value={f.egress} onChange={set('egress')}><option value="">default (all)</option><option value="all">all</option><option value="none">none</option></select></label>
        <label class="wide">Env (KEY=VALUE, one a line)<textarea value={f.env} onInput={set('env')} rows={2} /></label>
        <label class="wide">Labels (key=value, one a line)<textarea data-testid="create-labels" value={f.labels} onInput={set('labels')} rows={2} /></label>
        <label class="wide">Allow (addresses, prefixes, names; egress none reaches only these)<input value={f.allow} onInput={set('allow')} placeholder="pypi.org, 192.0.2.0/24" /></label>
        <label class="wide">Deny<input value={f.deny} onInput={set('deny')} placeholder="*.example.com" /></label>
        <label class="wide">Secrets as env (VAR=secret-name, one a line)<textarea value={f.secrets} onInput={set('secrets')} rows={2} /></label>
        <label class="wide">Secrets as files (/abs/path=secret-name, one a line)<textarea value={f.secretFiles} onInput={set('secretFiles')} rows={2} /></label>
        <label class="wide">Services (name=command, one a line; started before the create returns)<textarea data-testid="create-services" value={f.services} onInput={set('services')} rows={2} /></label>
        <label class="check"><input type="checkbox" checked={f.public} onChange={set('public')} /> Public URL (open to anyone who reaches the daemon)</label>
      </div>
      <Err text={err} />
      <div class="row">
        <button type="submit" class="primary" data-testid="create-submit" disabled={busy}>{busy ? 'Creating…' : 'Create'}</button>
        <button type="button" onClick={() => done()}>Cancel</button>
      </div>
    </form>
  )
}

/** Two readings of a sandbox's CPU time, and when they were taken. */
interface Reading { seconds: number, at: number, cores?: number }

/** readCPU takes the list's CPU times in, with the cores used since the last. */
function readCPU (prev: Record<string, Reading>, list: Sandbox[]): Record<string, Reading> {
  const now = performance.now()
  const next: Record<string, Reading> = {}
  for (const sb of list) {
    if (sb.usage === undefined) continue
    const p = prev[sb.id]
    const r: Reading = { seconds: sb.usage.cpu_seconds, at: now }
    // A restore or a wake starts a new container, whose counter starts
    // again: no reading across it.
    if (p !== undefined && now > p.at && sb.usage.cpu_seconds >= p.seconds) {
      r.cores = (sb.usage.cpu_seconds - p.seconds) / ((now - p.at) / 1000)
    }
    next[sb.id] = r
  }
  return next
}

/** Usage is what a running sandbox uses of its CPU and memory limits. */
function Usage ({ sb, reading }: { sb: Sandbox, reading?: Reading }) {
  const cpus = sb.resources.cpus ?? '–'
  const mib = sb.resources.memory_mib ?? '–'
  if (sb.usage === undefined) return <span class="muted">{cpus} CPU / {mib} MiB</span>
  const cores = reading?.cores
  return (
    <span title={`${sb.usage.cpu_seconds.toFixed(1)} s of CPU since its container started`}>
      {cores === undefined ? '…' : cores.toFixed(2)} of {cpus} CPU / {bytes(sb.usage.memory_bytes)} of {mib} MiB
    </span>
  )
}
