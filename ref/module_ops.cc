#include "ref/module_ops.h"
