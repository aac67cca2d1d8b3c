// A file browser of a sandbox: directories listed by its agent (every
// path resolved inside the sandbox), download, upload into the directory
// shown, and delete.
import { useEffect, useState } from 'preact/hooks'
import { files, message, type FileInfo } from './api'
import { Err, bytes, useAction, useConfirm, when } from './ui'

const HOME = '/home/loam'

export function Files ({ sandbox, running }: { sandbox: string, running: boolean }) {
  const [dir, setDir] = useState(HOME)
  const [go, setGo] = useState(HOME)
  const [listing, setListing] = useState<FileInfo | null>(null)
  const [err, setErr] = useState('')
  const [tick, setTick] = useState(0)
  const [run, actErr, busy] = useAction()
  const [ask, dialog] = useConfirm()

  useEffect(() => {
    if (!running) return
    let live = true
    files.list(sandbox, dir).then(l => { if (live) { setListing(l); setErr('') } }, e => { if (live) { setListing(null); setErr(message(e)) } })
    return () => { live = false }
  }, [sandbox, dir, running, tick])
  useEffect(() => setGo(dir), [dir])

  if (!running) return <p class="muted">The sandbox is not running: wake it to browse its files.</p>
  const join = (name: string) => (dir === '/' ? '' : dir) + '/' + name
  const up = dir === '/' ? null : dir.slice(0, dir.lastIndexOf('/')) || '/'
  const download = (f: FileInfo) => run(async () => {
    const blob = await files.download(sandbox, f.path)
    const a = document.createElement('a')
    a.href = URL.createObjectURL(blob)
    a.download = f.path.slice(f.path.lastIndexOf('/') + 1)
    a.click()
    setTimeout(() => URL.revokeObjectURL(a.href), 10000)
  })
  const upload = (list: FileList | null) => run(async () => {
    for (const f of Array.from(list ?? [])) await files.upload(sandbox, join(f.name), f)
    setTick(t => t + 1)
  })
  return (
    <div class="files">
      <form class="row" onSubmit={e => { e.preventDefault(); setDir(go.replace(/\/+$/, '') || '/') }}>
        <input class="grow mono" data-testid="files-path" value={go} onInput={e => setGo(e.currentTarget.value)} />
        <button type="submit">Go</button>
        <button type="button" onClick={() => setTick(t => t + 1)}>Refresh</button>
        <label class="button">Upload<input type="file" multiple hidden data-testid="files-upload" onChange={e => { void upload(e.currentTarget.files); e.currentTarget.value = '' }} /></label>
        {busy && <span class="muted small">working…</span>}
      </form>
      <Err text={err || actErr} />
      {listing && listing.type !== 'dir' && <p>{listing.path} is a {listing.type} ({bytes(listing.size)}). <button onClick={() => download(listing)}>Download</button></p>}
      {listing && listing.type === 'dir' && (
        <table class="listing" data-testid="files">
          <thead><tr><th>Name</th><th>Size</th><th>Mode</th><th>Modified</th><th /></tr></thead>
          <tbody>
            {up !== null && <tr><td><button class="link" onClick={() => setDir(up)}>..</button></td><td /><td /><td /><td /></tr>}
            {(listing.entries ?? []).map(f => {
              const name = f.path.slice(f.path.lastIndexOf('/') + 1)
              return (
                <tr key={f.path} data-testid={`file-${name}`}>
                  <td>{f.type === 'dir'
                    ? <button class="link" data-testid={`dir-${name}`} onClick={() => setDir(f.path)}>{name}/</button>
                    : <span>{name}{f.type === 'symlink' ? ` → ${f.target}` : ''}</span>}</td>
                  <td>{f.type === 'file' ? bytes(f.size) : ''}</td>
                  <td class="mono">{f.mode}</td>
                  <td>{when(f.mtime)}</td>
                  <td class="actions">
                    {f.type === 'file' && <button data-testid="download" onClick={() => download(f)}>Download</button>}
                    <button class="danger" onClick={() => ask(`Delete ${f.path}${f.type === 'dir' ? ' and everything in it' : ''}?`, 'Delete',
                      async () => { await files.remove(sandbox, f.path, f.type === 'dir'); setTick(t => t + 1) })}>Delete</button>
                  </td>
                </tr>
              )
            })}
          </tbody>
        </table>
      )}
      {listing?.truncated && <p class="muted">The listing stops at 10,000 entries.</p>}
      {dialog}
    </div>
  )
}
