"""What the object-storage tests share: a ``sitecustomize.py`` for their child processes that makes
any Python-level connection to an address but this machine fail loudly (tensorstore's C++ client
is pointed at the emulator by TENSORSTORE_GCS_HTTP_URL)."""

LOCAL_ONLY_SITECUSTOMIZE = '''
import socket, sys
_connect = socket.socket.connect
def _local_only(self, address):
    if isinstance(address, tuple) and address[0] not in ('127.0.0.1', 'localhost', '::1'):
        sys.stderr.write(f'BLOCKED connection to {address}\\n')
        raise OSError(f'blocked connection to {address}')
    return _connect(self, address)
socket.socket.connect = _local_only
'''
