"""Object storage through a GCS emulator named by STORAGE_EMULATOR_HOST alone."""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Set by a user of an emulator before this project derived them from STORAGE_EMULATOR_HOST.
_DERIVED = ('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'TENSORSTORE_GCS_HTTP_URL',
            'GOOGLE_AUTH_TOKEN_FOR_TESTING', 'FSSPEC_GS_TOKEN', 'NO_GCE_CHECK')


def test_emulator_settings_are_derived_from_storage_emulator_host():
  show = ('from data import storage; import os, fsspec; print(['
          + ', '.join(f'os.environ.get({k!r})' for k in _DERIVED[:3])
          + ", fsspec.config.conf.get('gs', {}).get('token')])")
  base = {k: v for k, v in os.environ.items() if k not in _DERIVED + ('STORAGE_EMULATOR_HOST',)}

  def derived(**env):
    return ast.literal_eval(subprocess.run([sys.executable, '-c', show], cwd=ROOT,
                                           env={**base, **env}, capture_output=True, text=True,
                                           check=True).stdout)

  assert derived(STORAGE_EMULATOR_HOST='127.0.0.1:9') == [
      'false', 'http://127.0.0.1:9', 'emulator', 'anon']
  assert derived() == [None, None, None, None]  # Google's servers: nothing changed
  assert derived(STORAGE_EMULATOR_HOST='http://127.0.0.1:9',  # a user's setting wins
                 GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT='true', FSSPEC_GS_TOKEN='cloud') == [
                     'true', 'http://127.0.0.1:9', 'emulator', 'cloud']
