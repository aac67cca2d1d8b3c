import { test } from 'node:test'
import assert from 'node:assert/strict'
import loam, { ConflictError, InvalidError, NotFoundError } from '@loam/sdk'
import { sandbox, until } from './helpers.js'

// The Go test serves a private registry on loopback with a busybox image
// (env GREETING, user app, working dir /srv, an entrypoint that writes
// /srv/started) and names it here.
const registry = process.env.LOAM_TEST_REGISTRY ?? ''
const ref = process.env.LOAM_TEST_IMAGE ?? ''
const user = process.env.LOAM_TEST_REGISTRY_USER ?? ''
const password = process.env.LOAM_TEST_REGISTRY_PASSWORD ?? ''

test('images and registries', async (t) => {
  assert.ok(registry && ref, 'LOAM_TEST_REGISTRY and LOAM_TEST_IMAGE must be set')
  await assert.rejects(loam.pullImage('Not A Ref'), InvalidError)

  const login = await loam.loginRegistry(registry, user, password)
  assert.equal(login.username, user)
  assert.ok((await loam.registries()).some((r) => r.registry === registry && r.username === user))

  let im = await loam.pullImage(ref)
  assert.equal(im.ref, ref)
  await until('the pull', async () => (im = await loam.image(im.id)).state !== 'pulling')
  assert.equal(im.state, 'ready', im.error)
  assert.ok(im.size > 0 && im.pulled === im.size, JSON.stringify(im))
  assert.equal(im.config.user, 'app')
  assert.ok((await loam.images()).some((x) => x.id === im.id))
  await assert.rejects(loam.image('im-000000000000'), NotFoundError)

  const box = await sandbox(t, 'ts-image', { image: ref })
  const r = await box.run(['sh', '-c', 'echo "$GREETING $(id -un) $(pwd)"'])
  assert.equal(r.stdout, 'from-image app /srv\n')
  await until('the entrypoint', async () => (await box.run(['cat', '/srv/started'])).exitCode === 0)
  await assert.rejects(loam.deleteImage(im.id), ConflictError)
  await box.delete()
  await loam.deleteImage(im.id)
  await assert.rejects(loam.image(im.id), NotFoundError)
  await loam.logoutRegistry(registry)
  assert.ok(!(await loam.registries()).some((r) => r.registry === registry))
})
