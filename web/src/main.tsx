// The console's page: login, then the list of sandboxes (#/), one
// sandbox (#/sandboxes/NAME) or, for an admin key, the audit log (#/audit). Routes live in the URL's fragment, so the
// daemon serves one page for all of them.
import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import { canAdmin, login, loginHint, logout, notAdmin, resume, whenLoggedOut, message, sessionWho } from './api'
import { AuditLog } from './audit'
import { SandboxList } from './list'
import { SandboxPage } from './sandbox'
import './style.css'

function useRoute (): string {
  const [hash, setHash] = useState(location.hash)
  useEffect(() => {
    const on = () => setHash(location.hash)
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  return hash
}

function Login ({ done }: { done: () => void }) {
  const [token, setToken] = useState('')
  const [err, setErr] = useState('')
  const [tokenFile, setTokenFile] = useState<string | undefined>(undefined)
  useEffect(() => { void loginHint().then(setTokenFile) }, [])
  return (
    <form class="login" onSubmit={async (e) => {
      e.preventDefault()
      setErr('')
      try {
        await login(token.trim())
        done()
      } catch (e) {
        setErr(message(e))
      }
    }}>
      <h1>loam</h1>
      <label>API token
        <input type="password" name="token" autocomplete="current-password" data-testid="token"
          value={token} onInput={e => setToken(e.currentTarget.value)} placeholder="loam_…" />
      </label>
      {err && <div class="error" role="alert">{err}</div>}
      <button type="submit" class="primary" data-testid="login">Log in</button>
      <p class="hint" data-testid="login-hint">The token is in <code>LOAM_TOKEN</code>{
        tokenFile === undefined
          ? <>, or in the file <code>token</code> of <code>loam serve</code>'s data dir</>
          : tokenFile === ''
            ? <>, as it was given to <code>loam serve</code></>
            : <>, or in the file this daemon keeps it in: <code>{tokenFile}</code></>
      }. The page keeps a session cookie, never the token.</p>
    </form>
  )
}

function App () {
  const [state, setState] = useState<'loading' | 'out' | 'in'>('loading')
  const route = useRoute()
  useEffect(() => {
    void resume().then(ok => setState(ok ? 'in' : 'out'))
    return whenLoggedOut(() => setState('out'))
  }, [])
  if (state === 'loading') return null
  if (state === 'out') return <Login done={() => setState('in')} />
  const m = /^#\/sandboxes\/([^/]+)$/.exec(route)
  return (
    <div class="app">
      <header>
        <a href="#/" class="brand">loam</a>
        <nav>
          <a href="#/">Sandboxes</a>
          {canAdmin()
            ? <a href="#/audit" data-testid="nav-audit">Audit log</a>
            : <span class="disabled" data-testid="nav-audit" aria-disabled="true" title={notAdmin}>Audit log</span>}
        </nav>
        <span class="muted small" data-testid="who">{sessionWho()}</span>
        <button class="link" data-testid="logout" onClick={async () => { await logout(); setState('out') }}>Log out</button>
      </header>
      <main>
        {m
          ? <SandboxPage key={m[1]} name={decodeURIComponent(m[1])} />
          : route === '#/audit' && canAdmin() ? <AuditLog /> : <SandboxList />}
      </main>
    </div>
  )
}

render(<App />, document.getElementById('app')!)
