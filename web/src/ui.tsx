// Small pieces the console's views share: a confirmation dialog, an error
// line, times and sizes.
import type { ComponentChildren } from 'preact'
import { useState } from 'preact/hooks'
import { canWrite, defaultIdle, message, readOnly } from './api'

/** A question the user must answer before something destructive. */
interface Question {
  text: string
  action: string
  run: () => Promise<unknown>
}

/**
 * useConfirm asks before destructive calls, as the CLI does on a terminal:
 * ask(text, action, run) shows a dialog whose button runs it. The dialog
 * shows the call's error, if any, and stays until it succeeds or is
 * cancelled.
 */
export function useConfirm (): [(text: string, action: string, run: () => Promise<unknown>) => void, ComponentChildren] {
  const [q, setQ] = useState<Question | null>(null)
  const [busy, setBusy] = useState(false)
  const [err, setErr] = useState('')
  const ask = (text: string, action: string, run: () => Promise<unknown>) => { setErr(''); setQ({ text, action, run }) }
  const dialog = q && (
    <div class="modal" role="dialog" aria-modal="true" data-testid="confirm">
      <div class="modal-box">
        <p>{q.text}</p>
        <Err text={err} />
        <div class="row">
          <button class="danger" data-testid="confirm-yes" disabled={busy} onClick={async () => {
            setBusy(true)
            try {
              await q.run()
              setQ(null)
            } catch (e) {
              setErr(message(e))
            } finally {
              setBusy(false)
            }
          }}>{busy ? q.action + '…' : q.action}</button>
          <button disabled={busy} onClick={() => setQ(null)}>Cancel</button>
        </div>
      </div>
    </div>
  )
  return [ask, dialog]
}

/** An error line; nothing when text is empty. */
export function Err ({ text }: { text: string }) {
  return text ? <div class="error" role="alert" data-testid="error">{text}</div> : null
}

/** useAction runs a call, keeping its error for an Err and its busy state. */
export function useAction (): [(f: () => Promise<unknown>) => Promise<void>, string, boolean] {
  const [err, setErr] = useState('')
  const [busy, setBusy] = useState(false)
  const run = async (f: () => Promise<unknown>) => {
    setErr('')
    setBusy(true)
    try {
      await f()
    } catch (e) {
      setErr(message(e))
    } finally {
      setBusy(false)
    }
  }
  return [run, err, busy]
}

/**
 * When a sandbox sleeps: after its own idle, else after the daemon's
 * default ("0": never), which it says it is. long adds "without activity".
 */
export function idleText (own: string | undefined, long = false): string {
  const idle = own || defaultIdle()
  const whose = own ? '' : " (the daemon's default)"
  return idle === '0' ? `never sleeps${whose}` : `sleeps after ${idle}${long ? ' without activity' : ''}${whose}`
}

export function ago (iso: string): string {
  const s = Math.round((Date.now() - Date.parse(iso)) / 1000)
  if (s < 60) return `${Math.max(s, 0)}s ago`
  if (s < 3600) return `${Math.floor(s / 60)}m ago`
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`
  return `${Math.floor(s / 86400)}d ago`
}

export function when (iso: string): string {
  return new Date(iso).toLocaleString()
}

export function bytes (n: number): string {
  if (n < 1024) return `${n} B`
  const units = ['KiB', 'MiB', 'GiB', 'TiB']
  let v = n / 1024
  let i = 0
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++ }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`
}

/** Parses "k=v" items (by commas or lines) into a map; an error names a bad item. */
export function pairs (text: string, what: string): Record<string, string> | undefined {
  const out: Record<string, string> = {}
  let any = false
  for (const item of text.split(/[,\n]/).map(s => s.trim()).filter(Boolean)) {
    const i = item.indexOf('=')
    if (i <= 0) throw new Error(`${what}: "${item}" is not KEY=VALUE`)
    out[item.slice(0, i)] = item.slice(i + 1)
    any = true
  }
  return any ? out : undefined
}

/** href of a sandbox's page. */
export const sandboxHref = (name: string) => `#/sandboxes/${encodeURIComponent(name)}`

/**
 * The props of a button a read key may not press: disabled, with the
 * reason as its title (none for a key that may).
 */
export function writes (busy = false): { disabled: boolean, title?: string } {
  return canWrite() ? { disabled: busy } : { disabled: true, title: readOnly }
}
