// A sandbox's checkpoints as a timeline, oldest first: memory checkpoints
// (processes resume) drawn filled, disk-only ones (a fresh boot on that
// disk) hollow, automatic ones (kept by a restore) marked with what they
// were taken before; each with restore, fork and delete, and the forks
// made from it.
import { useEffect, useState } from 'preact/hooks'
import { checkpoints, sandboxes, message, type Checkpoint, type Sandbox } from './api'
import { Err, ago, sandboxHref, useAction, useConfirm, when, writes } from './ui'

export function Timeline ({ sb, all, changed }: { sb: Sandbox, all: Sandbox[], changed: () => void }) {
  const [list, setList] = useState<Checkpoint[] | null>(null)
  const [err, setErr] = useState('')
  const [tick, setTick] = useState(0)
  const [ask, dialog] = useConfirm()
  const reload = () => { setTick(t => t + 1); changed() }

  useEffect(() => {
    let live = true
    const load = async () => {
      try {
        const l = await checkpoints.list(sb.id)
        if (live) { setList(l); setErr('') }
      } catch (e) {
        if (live) setErr(message(e))
      }
    }
    void load()
    const t = setInterval(load, 5000)
    return () => { live = false; clearInterval(t) }
  }, [sb.id, tick])

  // A fork names its source by the name or id and the checkpoint by id or
  // name, as its create gave them.
  const forksOf = (cp: Checkpoint) => all.filter(f => f.from &&
    (f.from.sandbox === sb.name || f.from.sandbox === sb.id) &&
    (f.from.checkpoint === cp.id || (cp.name !== undefined && cp.name !== '' && f.from.checkpoint === cp.name)))

  return (
    <div class="timeline-view">
      <NewCheckpoint sb={sb} done={reload} />
      <Err text={err} />
      {list !== null && list.length === 0 && <p class="muted">No checkpoints yet.</p>}
      <ol class="timeline" data-testid="timeline">
        {(list ?? []).map(cp => <Point key={cp.id} sb={sb} cp={cp} forks={forksOf(cp)} ask={ask} changed={reload} />)}
        {list !== null && list.length > 0 && <li class="point now"><span class="dot" /><div class="body"><strong>now</strong> <span class="muted">{sb.state}</span></div></li>}
      </ol>
      <p class="legend muted small"><span class="dot mem" /> memory checkpoint: processes resume · <span class="dot disk" /> disk only: boots fresh on that disk · <span class="badge auto">auto</span> kept by a restore</p>
      {dialog}
    </div>
  )
}

function NewCheckpoint ({ sb, done }: { sb: Sandbox, done: () => void }) {
  const [name, setName] = useState('')
  const [comment, setComment] = useState('')
  const [memory, setMemory] = useState(true)
  const [run, err, busy] = useAction()
  return (
    <form class="card row wrap" data-testid="checkpoint-form" onSubmit={e => {
      e.preventDefault()
      void run(async () => {
        await checkpoints.create(sb.id, { name: name || undefined, comment: comment || undefined, memory })
        setName(''); setComment('')
        done()
      })
    }}>
      <input data-testid="checkpoint-name" placeholder="name (optional)" value={name} onInput={e => setName(e.currentTarget.value)} />
      <input data-testid="checkpoint-comment" class="grow" placeholder="comment: what this point is" value={comment} onInput={e => setComment(e.currentTarget.value)} />
      <label class="check"><input type="checkbox" data-testid="checkpoint-memory" checked={memory} onChange={e => setMemory(e.currentTarget.checked)} /> memory (processes resume)</label>
      <button type="submit" class="primary" data-testid="checkpoint" {...writes(busy)}>{busy ? 'Checkpointing…' : 'Checkpoint'}</button>
      <Err text={err} />
    </form>
  )
}

function Point ({ sb, cp, forks, ask, changed }: {
  sb: Sandbox
  cp: Checkpoint
  forks: Sandbox[]
  ask: (text: string, action: string, run: () => Promise<unknown>) => void
  changed: () => void
}) {
  const [forking, setForking] = useState(false)
  const [forkName, setForkName] = useState('')
  const [run, err, busy] = useAction()
  const restore = () => ask(
    `Restore ${sb.name} to ${cp.id}${cp.name ? ` (${cp.name})` : ''}? Its disk${cp.memory ? ', memory and processes' : ' (it boots fresh)'} go back to that point; the state it is in now is kept as an automatic checkpoint first.`,
    'Restore', async () => { await checkpoints.restore(sb.id, cp.id); changed() })
  const remove = () => ask(`Delete checkpoint ${cp.id} of ${sb.name}? This cannot be undone.`, 'Delete',
    async () => { await checkpoints.remove(sb.id, cp.id); changed() })
  return (
    <li class={`point ${cp.memory ? 'mem' : 'disk'}${cp.auto ? ' auto' : ''}`} data-testid={`checkpoint-${cp.id}`}>
      <span class={`dot ${cp.memory ? 'mem' : 'disk'}`} title={cp.memory ? 'memory checkpoint' : 'disk-only checkpoint'} />
      <div class="body">
        <div class="row wrap">
          <strong class="cp-id">{cp.id}</strong>
          {cp.name && <span class="cp-name">{cp.name}</span>}
          <span class={`badge ${cp.memory ? 'mem' : 'disk'}`}>{cp.memory ? 'memory' : 'disk only'}</span>
          {cp.auto && <span class="badge auto" title="kept automatically by a restore">auto</span>}
          <span class="muted small" title={when(cp.created_at)}>{ago(cp.created_at)}</span>
        </div>
        {cp.auto
          ? <div class="comment">taken {cp.comment ? cp.comment.replace(/^before /, 'before ') : 'automatically'}</div>
          : cp.comment && <div class="comment">{cp.comment}</div>}
        {forks.length > 0 && <div class="forks small" data-testid="forks">forks: {forks.map(f => <a key={f.id} href={sandboxHref(f.name)}>{f.name}</a>)}</div>}
        <div class="row wrap">
          <button data-testid="restore" {...writes()} onClick={restore}>Restore</button>
          <button data-testid="fork" {...writes()} onClick={() => setForking(!forking)}>Fork</button>
          <button class="danger" data-testid="delete-checkpoint" {...writes()} onClick={remove}>Delete</button>
        </div>
        {forking && (
          <form class="row" onSubmit={e => {
            e.preventDefault()
            void run(async () => {
              const f = await sandboxes.create({ name: forkName || undefined, from: { sandbox: sb.name, checkpoint: cp.id } })
              setForking(false)
              location.hash = sandboxHref(f.name)
            })
          }}>
            <input data-testid="fork-name" placeholder="new sandbox's name (optional)" value={forkName} onInput={e => setForkName(e.currentTarget.value)} />
            <button type="submit" class="primary" data-testid="fork-submit" disabled={busy}>{busy ? 'Forking…' : `Fork from ${cp.id}`}</button>
          </form>
        )}
        <Err text={err} />
      </div>
    </li>
  )
}
