import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { ConflictError, InvalidError, LimitError, Loam, LoamError, NotFoundError, UnauthorizedError } from '@loam/sdk'
import { sandbox } from './helpers.js'

test('create with every field, list, get, sleep, wake, access token, network', async (t) => {
  const secret = `ts-secret-${process.pid}`
  await loam.setSecret(secret, 's3cret value')
  t.after(() => loam.deleteSecret(secret, { force: true }))
  assert.ok((await loam.secrets()).some((s) => s.name === secret))

  const box = await sandbox(t, 'ts-full', {
    template: 'busybox',
    env: { GREETING: 'hi' },
    labels: { suite: 'ts', run: String(process.pid) },
    idle: '30m',
    http_port: 8000,
    public: true,
    secrets: { API_KEY: secret },
    secret_files: { '/home/loam/key.txt': secret },
    network: { egress: 'none', allow: ['192.0.2.7'], deny: [] },
    services: [{ name: 'web', cmd: ['busybox', 'httpd', '-f', '-p', '8000'] }],
  })
  const info = box.created!
  assert.equal(info.name, 'ts-full')
  assert.equal(info.state, 'running')
  assert.equal(info.template, 'busybox')
  assert.deepEqual(info.env, { GREETING: 'hi' })
  assert.equal(info.idle, '30m')
  assert.equal(info.http_port, 8000)
  assert.equal(info.public, true)
  assert.deepEqual(info.secrets, { API_KEY: secret })
  assert.deepEqual(info.secret_files, { '/home/loam/key.txt': secret })
  assert.equal(info.network.egress, 'none')
  assert.deepEqual(info.network.allow, ['192.0.2.7/32'], 'an address is kept as its /32')

  const r = await box.run(['sh', '-c', 'echo $GREETING $API_KEY; cat /home/loam/key.txt'])
  assert.equal(r.stdout, 'hi s3cret value\ns3cret value')
  assert.equal((await box.getService('web')).name, 'web')

  // A secret in use is deleted only with force.
  await assert.rejects(loam.deleteSecret(secret), ConflictError)

  const mine = await loam.list({ labels: { suite: 'ts', run: String(process.pid) } })
  assert.deepEqual(mine.map((s) => s.name), ['ts-full'])
  assert.deepEqual(await loam.list({ labels: { suite: 'ts', run: 'none' } }), [])
  assert.ok((await loam.list()).some((s) => s.id === info.id))
  assert.equal((await loam.get('ts-full')).id, info.id)

  const at = await box.accessToken()
  assert.equal(at.url, info.url)
  assert.ok(at.access_token.length > 0)

  assert.equal((await box.network()).egress, 'none')
  const changed = await box.setNetwork({ egress: 'all', deny: ['198.51.100.0/24'] })
  assert.equal(changed.network.egress, 'all')
  assert.deepEqual((await box.network()).deny, ['198.51.100.0/24'])

  assert.equal((await box.sleep()).state, 'sleeping')
  assert.equal((await box.info()).state, 'sleeping')
  // An update changes what it gives, leaves the rest, and does not wake it.
  const updated = await box.update({ public: true, http_port: 3000, labels: { suite: 'ts', run: String(process.pid), extra: 'yes' } })
  assert.equal(updated.state, 'sleeping')
  assert.equal(updated.public, true)
  assert.equal(updated.http_port, 3000)
  assert.equal(updated.labels?.extra, 'yes')
  assert.equal(updated.network.egress, 'all')
  await assert.rejects(box.update({}), InvalidError)
  await assert.rejects(box.update({ idle: 'soon' }), InvalidError)
  assert.equal((await box.wake()).state, 'running')
  assert.equal((await box.run(['echo', 'awake'])).stdout, 'awake\n')
})

test('openapi', async () => {
  const doc = await loam.openapi()
  assert.match(doc, /^openapi: 3\.1/m)
  assert.match(doc, /\/v1\/sandboxes\/\{sandbox\}:/)
})

test('templates', async () => {
  const ts = await loam.templates()
  const busybox = ts.find((x) => x.name === 'busybox')
  assert.ok(busybox, JSON.stringify(ts))
  assert.equal(busybox.ready, true)
  assert.equal(ts.filter((x) => x.default).length, 1)
})

test('errors are classes', async (t) => {
  const box = await sandbox(t, 'ts-errors')
  await assert.rejects(loam.get('no-such-sandbox'), (e: unknown) => {
    assert.ok(e instanceof NotFoundError && e instanceof LoamError)
    assert.equal(e.code, 'not_found')
    assert.equal(e.status, 404)
    assert.match(e.message, /no-such-sandbox/)
    return true
  })
  await assert.rejects(loam.create({ name: 'Not A Name' }), { name: 'InvalidError', code: 'invalid', status: 400 })
  await assert.rejects(loam.create({ name: 'ts-errors' }), ConflictError)
  await assert.rejects(loam.create({ idle: 'soon' }), InvalidError)
  const wrong = new Loam({ url: process.env.LOAM_API_URL, token: 'wrong' })
  await assert.rejects(wrong.list(), (e: unknown) => e instanceof UnauthorizedError && e.status === 401)
  await assert.rejects(wrong.sandbox('ts-errors').run(['true']), UnauthorizedError)
  await assert.rejects(box.getCheckpoint('v999'), NotFoundError)

  // The checkpoint limit: disk-only checkpoints up to it, then LimitError.
  const limit = Number(process.env.LOAM_CHECKPOINT_LIMIT ?? 10)
  for (let i = 0; i < limit; i++) await box.createCheckpoint({ memory: false, comment: `n${i}` })
  await assert.rejects(box.createCheckpoint({ memory: false }), (e: unknown) => e instanceof LimitError && e.code === 'limit' && e.status === 409)
  const cps = await box.checkpoints()
  assert.equal(cps.length, limit)
  assert.ok(cps.every((c) => !c.memory))
})

test('an AbortSignal and a timeout end a plain call', async (t) => {
  const box = await sandbox(t, 'ts-abort')
  const s = await box.startSession(['sleep', '60'])
  const ctl = new AbortController()
  setTimeout(() => ctl.abort(new Error('stop waiting')), 300)
  await assert.rejects(box.waitSession(s.id, { signal: ctl.signal }), { message: 'stop waiting' })
  await assert.rejects(box.waitSession(s.id, { timeout: 300 }), { name: 'TimeoutError' })
  // An aborted signal stops the call before it is sent.
  await assert.rejects(loam.create({ name: 'ts-never' }, { signal: ctl.signal }), { message: 'stop waiting' })
  await assert.rejects(loam.get('ts-never'), NotFoundError)
  assert.equal((await box.getSession(s.id)).state, 'running')
})

test('importing the default client never throws; using it without a token does', async () => {
  const { execFile } = await import('node:child_process')
  const script = `import loam from '@loam/sdk'
console.log('imported')
await loam.list().catch((e) => console.log(e.name, e.code))`
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => k !== 'LOAM_TOKEN'))
  env.LOAM_DATA_DIR = '/nonexistent'
  const out = await new Promise<string>((resolve, reject) =>
    execFile(process.execPath, ['--input-type=module', '-e', script], { env }, (err, stdout, stderr) =>
      err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
    ),
  )
  assert.equal(out, 'imported\nUnauthorizedError unauthorized\n')
})
