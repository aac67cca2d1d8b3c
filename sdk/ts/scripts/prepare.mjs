// npm runs this (the "prepare" script) when the SDK is installed from a
// directory (npm install /path/to/loam/sdk/ts), packed (npm pack) or set up
// here (npm ci): it builds dist/, which the repository does not hold. An
// install from a directory runs it without the SDK's devDependencies, so the
// first time it installs them here, from the lockfile. What it prints goes
// to stderr, to keep npm pack's stdout for the tarball's name.
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const dir = join(dirname(fileURLToPath(import.meta.url)), '..')
const tsc = join(dir, 'node_modules', 'typescript', 'bin', 'tsc')
if (!existsSync(tsc)) {
  // --include=dev: the installing project's --omit=dev (or NODE_ENV=production)
  // is in the environment npm gives this script.
  execFileSync('npm', ['ci', '--include=dev', '--ignore-scripts', '--no-audit', '--no-fund'], { cwd: dir, stdio: ['ignore', 2, 2] })
}
execFileSync(process.execPath, [tsc, '-p', join(dir, 'tsconfig.json')], { cwd: dir, stdio: ['ignore', 2, 2] })
