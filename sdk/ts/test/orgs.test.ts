import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { ConflictError, ForbiddenError, InvalidError, Loam, NotFoundError, UnauthorizedError } from '@loam/sdk'

// The other tests share this daemon: the quota set here is roomy, and
// taken away at the end.
test('orgs, quotas and keys', async () => {
  const org = await loam.org()
  assert.equal(org.name, 'default')
  assert.equal(typeof org.use.sandboxes, 'number')
  assert.ok((await loam.orgs()).some((o) => o.name === 'default'))

  const set = await loam.setQuota('default', { sandboxes: 1000, memory_mib: 1 << 30, cpus: 512 })
  assert.deepEqual(set.quota, { sandboxes: 1000, memory_mib: 1 << 30, cpus: 512 })
  assert.equal((await loam.org()).quota.sandboxes, 1000)
  await assert.rejects(loam.setQuota('default', { sandboxes: -1 }), InvalidError)
  await assert.rejects(loam.setQuota('nosuch', {}), NotFoundError)
  assert.deepEqual((await loam.setQuota('default', {})).quota, {})

  // An org's key, even an admin's, is not the operator.
  const key = await loam.createKey({ name: 'ts-orgs', scope: 'admin', expires_in: '1h', labels: { owner: 'ts' } })
  assert.ok(key.secret?.startsWith('loam_key_'))
  assert.deepEqual(key.labels, { owner: 'ts' })
  assert.ok((await loam.keys()).some((k) => k.id === key.id && k.secret === undefined))
  const admin = new Loam({ token: key.secret })
  assert.equal((await admin.org()).name, 'default')
  await assert.rejects(admin.setQuota('default', {}), ForbiddenError)
  await assert.rejects(admin.orgs(), ForbiddenError)
  const made = await loam.audit({ action: 'key.create', since: '1h' })
  assert.ok(made.some((e) => e.target === `keys/${key.id}` && e.outcome === 'ok' && e.key === 'admin'))
  await loam.revokeKey(key.id)
  await assert.rejects(admin.org(), UnauthorizedError)
  await assert.rejects(loam.revokeKey(key.id), NotFoundError)
})

// An org of its own: its key sees its sandboxes only, the same name is
// two sandboxes, and the org goes with everything in it only when asked.
test('orgs of their own', async () => {
  const made = await loam.createOrg('ts-team')
  assert.equal(made.name, 'ts-team')
  await assert.rejects(loam.createOrg('ts-team'), ConflictError)
  await assert.rejects(loam.createOrg('Bad--Org'), InvalidError)
  await assert.rejects(loam.createOrgKey('nosuch', { name: 'x' }), NotFoundError)
  const key = await loam.createOrgKey('ts-team', { name: 'ts-team-admin', scope: 'admin' })
  assert.equal(key.org, 'ts-team')
  const team = new Loam({ token: key.secret })
  assert.equal((await team.org()).name, 'ts-team')
  await assert.rejects(team.createOrg('other'), ForbiddenError)

  const theirs = (await team.create({ name: 'ts-org-web' })).created!
  assert.match(theirs.url, /^https?:\/\/ts-org-web--ts-team\./)
  const ours = (await loam.create({ name: 'ts-org-web' })).created!
  assert.notEqual(ours.id, theirs.id)
  await assert.rejects(team.get(ours.id), NotFoundError)
  assert.deepEqual((await team.list()).map((s) => s.id), [theirs.id])

  await assert.rejects(loam.deleteOrg('ts-team'), ConflictError)
  await loam.deleteOrg('ts-team', { all: true })
  await assert.rejects(team.org(), UnauthorizedError)
  await assert.rejects(loam.deleteOrg('ts-team'), NotFoundError)
  assert.equal((await loam.get('ts-org-web')).id, ours.id)
  await loam.sandbox('ts-org-web').delete()
})
