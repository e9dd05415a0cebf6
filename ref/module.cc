#include "ref/module.h"
