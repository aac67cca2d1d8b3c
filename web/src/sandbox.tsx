// One sandbox: its settings and state, its checkpoint timeline, a
// terminal, its services and its files. Every tab stays mounted once
// opened, so the terminal keeps its session while another tab is shown.
import { useEffect, useState } from 'preact/hooks'
import { sandboxes, message, type Sandbox } from './api'
import { Err, idleText, sandboxHref, useAction, useConfirm, when, writes } from './ui'
import { Labels, Lifecycle, OpenURL, State, REFRESH_MS } from './list'
import { Timeline } from './timeline'
import { Terminals } from './terminal'
import { Services } from './services'
import { Files } from './files'

const TABS = ['timeline', 'terminal', 'services', 'files'] as const
type Tab = typeof TABS[number]

export function SandboxPage ({ name }: { name: string }) {
  const [sb, setSb] = useState<Sandbox | null>(null)
  const [all, setAll] = useState<Sandbox[]>([])
  const [err, setErr] = useState('')
  const [tick, setTick] = useState(0)
  const [tab, setTab] = useState<Tab>('timeline')
  const [opened, setOpened] = useState<Set<Tab>>(new Set(['timeline']))
  const [ask, dialog] = useConfirm()
  const [act, actErr] = useAction()

  useEffect(() => {
    let live = true
    const load = async () => {
      try {
        // The whole list, for the forks of this sandbox's checkpoints.
        const [one, list] = await Promise.all([sandboxes.get(name), sandboxes.list([])])
        if (live) { setSb(one); setAll(list); setErr('') }
      } catch (e) {
        if (live) setErr(message(e))
      }
    }
    void load()
    const t = setInterval(load, REFRESH_MS)
    return () => { live = false; clearInterval(t) }
  }, [name, tick])
  const refresh = () => setTick(t => t + 1)
  const show = (t: Tab) => { setTab(t); setOpened(new Set([...opened, t])) }

  if (sb === null) return <section><Err text={err} />{!err && <p class="muted">Loading…</p>}</section>
  const running = sb.state === 'running'
  return (
    <section data-testid="sandbox-page">
      <div class="toolbar">
        <h2 data-testid="sandbox-name">{sb.name}</h2>
        <State sb={sb} />
        <span class="muted small">{sb.id}</span>
        <span class="spacer" />
        <Lifecycle sb={sb} act={act} ask={ask} after={refresh} deleted={() => { location.hash = '#/' }} />
      </div>
      <Err text={err || actErr} />
      {sb.reason && <div class="error">{sb.reason}</div>}
      <dl class="facts">
        <dt>{sb.image ? 'Image' : 'Template'}</dt><dd>{sb.image ?? sb.template}</dd>
        <dt>Resources</dt><dd>{sb.resources.cpus} CPU, {sb.resources.memory_mib} MiB memory, {sb.resources.disk_mib} MiB disk</dd>
        <dt>Labels</dt><dd><Labels labels={sb.labels} /></dd>
        <dt>URL</dt><dd><OpenURL sb={sb} /> {sb.public ? '(public)' : '(private: opened with its access token)'}</dd>
        <dt>Idle</dt><dd data-testid="idle">{idleText(sb.idle, true)}</dd>
        {sb.from && <><dt>Forked from</dt><dd data-testid="fork-origin"><a href={sandboxHref(sb.from.sandbox)}>{sb.from.sandbox}</a> at checkpoint {sb.from.checkpoint}</dd></>}
        <dt>Created</dt><dd>{when(sb.created_at)}</dd>
      </dl>
      <div class="tabs" role="tablist">
        {TABS.map(t => <button key={t} role="tab" aria-selected={tab === t} class={tab === t ? 'tab active' : 'tab'} data-testid={`tab-${t}`} {...(t === 'terminal' || t === 'files' ? writes() : {})} onClick={() => show(t)}>{t[0].toUpperCase() + t.slice(1)}</button>)}
      </div>
      <div class="tab-body" hidden={tab !== 'timeline'}><Timeline sb={sb} all={all} changed={refresh} /></div>
      {opened.has('terminal') && <div class="tab-body" hidden={tab !== 'terminal'}>
        <Terminals sandbox={sb.name} />
      </div>}
      {opened.has('services') && <div class="tab-body" hidden={tab !== 'services'}><Services sandbox={sb.name} running={running} /></div>}
      {opened.has('files') && <div class="tab-body" hidden={tab !== 'files'}><Files sandbox={sb.name} running={running} /></div>}
      {dialog}
    </section>
  )
}

